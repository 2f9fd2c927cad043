package repos

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/pds"
)

func TestResolverLoginBackoff(t *testing.T) {
	ctx := context.Background()
	srv, err := pds.New(pds.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	did, err := srv.CreateAccount(ctx, "owner.test", "right-password")
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = v1alpha1.AddToScheme(scheme)
	_ = corev1.AddToScheme(scheme)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "pw", Namespace: "ns"}, Data: map[string][]byte{"password": []byte("wrong")}}
	repo := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "ns"},
		Spec: v1alpha1.AtprotoRepoSpec{Remote: &v1alpha1.RemoteRepoSource{Service: srv.URL(), Identifier: "owner.test",
			CredentialsRef: v1alpha1.SecretKeyRef{Name: "pw"}}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sec, repo).Build()
	now := time.Unix(1_800_000_000, 0)
	res := &Resolver{PDS: srv, Client: c, now: func() time.Time { return now }}
	key := types.NamespacedName{Namespace: "ns", Name: "r"}

	connect := func(times int) (err error) {
		for i := 0; i < times; i++ {
			_, err = res.ForRef(ctx, "ns", v1alpha1.ObjectRef{Name: "r"})
		}
		return err
	}
	steps := []struct {
		advance  time.Duration
		attempts int
		retry    time.Duration
	}{
		{0, 1, 2 * time.Second},                       // first failure: wait 2 s
		{time.Second, 1, time.Second},                 // still waiting
		{time.Second, 2, 4 * time.Second},             // second attempt: wait 4 s
		{3 * time.Second, 2, time.Second},             // not yet
		{time.Second, 3, 8 * time.Second},             // third attempt
		{time.Hour, 4, 16 * time.Second},              // one attempt however long the wait
		{DefaultLoginBackoffMax, 5, 32 * time.Second}, // the wait doubles, capped at 5 min
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		err := connect(50) // fifty callers in the same instant
		if !errors.Is(err, ErrLoginFailed) {
			t.Fatalf("step %d: %v, want ErrLoginFailed", i, err)
		}
		if got := res.LoginAttempts(key); got != s.attempts {
			t.Fatalf("step %d: %d login attempts, want %d", i, got, s.attempts)
		}
		if got := RetryAfter(err); got != s.retry {
			t.Fatalf("step %d: retry after %s, want %s", i, got, s.retry)
		}
	}

	// New credentials are tried at once, and the session is reused afterwards.
	sec.Data["password"] = []byte("right-password")
	if err := c.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	r, err := res.ForRef(ctx, "ns", v1alpha1.ObjectRef{Name: "r"})
	if err != nil || r.DID() != did {
		t.Fatalf("after the fix: %v %v", err, r)
	}
	_ = connect(20)
	if got := res.LoginAttempts(key); got != 1 {
		t.Fatalf("%d logins with the new credentials, want 1", got)
	}
	if _, err := res.ForRef(ctx, "ns", v1alpha1.ObjectRef{Name: "missing"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing AtprotoRepo: %v, want ErrUnavailable", err)
	}
}
