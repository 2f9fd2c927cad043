package manager

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fakeAPIServer serves the discovery of core/v1 ConfigMaps and answers their list with
// list(w, r). It stands in for an API server whose answer to one list is what a test needs;
// everything from the REST config to the informers is the real client-go and
// controller-runtime.
func fakeAPIServer(t *testing.T, list http.HandlerFunc) *rest.Config {
	t.Helper()
	mux := http.NewServeMux()
	js := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("/api", func(w http.ResponseWriter, _ *http.Request) {
		js(w, metav1.APIVersions{TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: "127.0.0.1"}}})
	})
	mux.HandleFunc("/apis", func(w http.ResponseWriter, _ *http.Request) {
		js(w, metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}})
	})
	mux.HandleFunc("/api/v1", func(w http.ResponseWriter, _ *http.Request) {
		js(w, metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: "v1",
			APIResources: []metav1.APIResource{{Name: "configmaps", Namespaced: true, Kind: "ConfigMap",
				Verbs: metav1.Verbs{"get", "list", "watch", "create", "update", "patch", "delete"}}}})
	})
	mux.HandleFunc("/api/v1/configmaps", list)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	// A list left hanging by an abandoned manager ends with its connection.
	t.Cleanup(srv.CloseClientConnections)
	return &rest.Config{Host: srv.URL}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startWithConfigMapIndex starts a manager whose cache must sync ConfigMaps before anything
// runs, as the controllers' field indexes make it, and returns Start's result.
func startWithConfigMapIndex(t *testing.T, ctx context.Context, cfg *rest.Config) <-chan error {
	t.Helper()
	m, err := New(cfg, Options{SkipNameValidation: true, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.GetFieldIndexer().IndexField(ctx, &corev1.ConfigMap{}, "data.key", func(o client.Object) []string {
		return []string{o.(*corev1.ConfigMap).Data["key"]}
	}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, m) }()
	return done
}

// A refused list ends Start with one error naming verb, resource and user, instead of
// an informer retrying it forever behind a cache that never syncs.
func TestStartEndsOnARefusedList(t *testing.T) {
	var lists int
	cfg := fakeAPIServer(t, func(w http.ResponseWriter, _ *http.Request) {
		lists++
		st := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "",
			errors.New(`User "system:serviceaccount:x:y" cannot list resource "configmaps" in API group "" at the cluster scope`)).ErrStatus
		st.Kind, st.APIVersion = "Status", "v1"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(st)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	select {
	case err := <-startWithConfigMapIndex(t, ctx, cfg):
		want := "controllers: forbidden: list configmaps as system:serviceaccount:x:y: grant it (see config/rbac)"
		if err == nil || err.Error() != want {
			t.Fatalf("Start: %v, want %q", err, want)
		}
		var f *Forbidden
		if !errors.As(err, &f) || f.Verb != "list" || f.Resource != "configmaps" {
			t.Errorf("error %#v is not a *Forbidden naming the list of configmaps", err)
		}
		t.Logf("ended in %s after %d lists", time.Since(t0).Round(time.Millisecond), lists)
	case <-time.After(10 * time.Second):
		t.Fatal("Start still running 10 s after the list was refused")
	}
}

// A stop while a cache waits for its first sync ends Start at once: controller-runtime's own
// Start would loop until the sync that never comes.
func TestStartEndsOnStopWhileCachesWait(t *testing.T) {
	cfg := fakeAPIServer(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // a list that never answers
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := startWithConfigMapIndex(t, ctx, cfg)
	time.Sleep(500 * time.Millisecond)
	t0 := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start after a stop: %v, want nil", err)
		}
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("Start returned %s after the stop", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start still running 10 s after its context ended")
	}
}

// Caches that never sync are reported after the timeout, naming it.
func TestStartEndsWhenCachesNeverSync(t *testing.T) {
	cfg := fakeAPIServer(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	m, err := New(cfg, Options{SkipNameValidation: true, Logger: quietLog(), CacheSyncTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetCache().GetInformer(context.Background(), &corev1.ConfigMap{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Run(context.Background(), m) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "caches did not sync within 300ms") {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Start still running 10 s into a %s cache sync timeout", 300*time.Millisecond)
	}
}
