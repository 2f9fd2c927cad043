package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// An apiserver that does not answer is a NotReady the caller retries, never an internal
// error, and the message names no address of the host.
func TestTenantErr(t *testing.T) {
	cm := schema.GroupResource{Resource: "configmaps"}
	for _, tc := range []struct {
		name     string
		err      error
		wantName string
		wantMsg  string
	}{
		{"client timeout", &url.Error{Op: "Patch", URL: "https://127.0.0.1:41234/api/v1", Err: timeoutErr{}}, ErrClusterNotReady, "timed out"},
		{"refused", &url.Error{Op: "Get", URL: "https://127.0.0.1:41234/api", Err: errors.New("connect: connection refused")}, ErrClusterNotReady, "connection failed"},
		{"wrapped by discovery", fmt.Errorf("unable to retrieve the complete list: %w", &url.Error{Op: "Get", URL: "https://127.0.0.1:41234/apis", Err: timeoutErr{}}), ErrClusterNotReady, "timed out"},
		{"deadline", context.DeadlineExceeded, ErrClusterNotReady, "timed out"},
		{"forbidden", apierrors.NewForbidden(cm, "x", errors.New("no")), ErrForbidden, "forbidden"},
		{"conflict", apierrors.NewConflict(cm, "x", errors.New("field owned")), ErrApplyConflict, "field owned"},
		{"unavailable", apierrors.NewServiceUnavailable("starting"), ErrClusterNotReady, "starting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e *Error
			if !errors.As(tenantErr(tc.err), &e) {
				t.Fatalf("tenantErr(%v) = %v, want an *Error", tc.err, tenantErr(tc.err))
			}
			if e.Name != tc.wantName || !strings.Contains(e.Message, tc.wantMsg) {
				t.Errorf("tenantErr(%v) = %s %q, want %s with %q", tc.err, e.Name, e.Message, tc.wantName, tc.wantMsg)
			}
			if strings.Contains(e.Message, "127.0.0.1") {
				t.Errorf("message names the host's address: %q", e.Message)
			}
		})
	}
}

// A call to a Sleeping cluster waits until its apiserver answers /readyz, across answers
// that are not yet 200, and is NotReady when the wait ends first.
func TestAwaitServing(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			t.Errorf("asked for %s", r.URL.Path)
		}
		if calls.Add(1) < 3 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	if err := awaitServing(context.Background(), cfg, "c1"); err != nil {
		t.Fatalf("awaitServing: %v", err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d calls, want 3 (two 503s, then 200)", n)
	}

	never := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer never.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	err := awaitServing(ctx, &rest.Config{Host: never.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}, "c2")
	var e *Error
	if !errors.As(err, &e) || e.Name != ErrClusterNotReady {
		t.Errorf("awaitServing on a cluster that never serves: %v, want ClusterNotReady", err)
	}
}
