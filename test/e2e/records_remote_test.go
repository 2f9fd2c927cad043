package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/testenv"
)

// remoteRepo creates a Secret with password and an AtprotoRepo logging in to service.
func remoteRepo(t *testing.T, env *testenv.Env, name, service, identifier, password string) {
	t.Helper()
	ctx := context.Background()
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-password", Namespace: ns}, Type: "password",
		Data: map[string][]byte{v1alpha1.DefaultCredentialsKey: []byte(password)}}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	r := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.AtprotoRepoSpec{Remote: &v1alpha1.RemoteRepoSource{Service: service, Identifier: identifier,
			CredentialsRef: v1alpha1.SecretKeyRef{Name: name + "-password"}}}}
	if err := env.Client.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
}

// countingProxy forwards to target and counts createSession calls.
func countingProxy(t *testing.T, target string) (string, *atomic.Int64) {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/com.atproto.server.createSession") {
			n.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

func TestACC_RemoteRepoWrongPasswordLoginFailedBounded(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	service, logins := countingProxy(t, env.PDS.URL())
	remoteRepo(t, env, "remote", service, env.Account.Handle, "not-the-password")
	r := waitRepoReason(t, env, "remote", v1alpha1.ReasonLoginFailed)
	c := meta.FindStatusCondition(r.Status.Conditions, string(v1alpha1.ConditionReady))
	if c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "AuthenticationRequired") {
		t.Fatalf("Ready %+v, want False naming AuthenticationRequired", c)
	}
	// Records and watches on the repo ask for it too; none of them may add logins.
	newRecord(t, env, "waiting", "remote", noteCollection, "waiting", note("later"))
	newWatch(t, env, "notes", "remote", noteCollection)
	waitRecord(t, env, "waiting", v1alpha1.ReasonRepoUnavailable)

	// Backoff 2 s, 4 s, 8 s ...: in 7 s at most 3 attempts (t=0, 2, 6), however many
	// reconciles ran meanwhile.
	time.Sleep(7 * time.Second)
	if n := logins.Load(); n < 2 || n > 3 {
		t.Fatalf("%d logins in 7 s, want 2-3 (capped exponential backoff)", n)
	}
	t.Logf("%d login attempts in 7 s", logins.Load())

	// Fixing the Secret starts afresh: logged in, the record written, the watch following.
	var sec corev1.Secret
	if err := env.Client.Get(ctx, key("remote-password"), &sec); err != nil {
		t.Fatal(err)
	}
	sec.Data[v1alpha1.DefaultCredentialsKey] = []byte(env.Account.Password)
	if err := env.Client.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	r = waitRepoReason(t, env, "remote", v1alpha1.ReasonLoggedIn)
	if r.Status.DID != env.Account.DID || r.Status.Endpoint != service {
		t.Fatalf("status %+v", r.Status)
	}
	rec := waitRecord(t, env, "waiting", v1alpha1.ReasonWritten)
	waitWatch(t, env, "notes", "the record written once logged in", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, rec.Status.URI, rec.Status.CID)
	})
}

func TestACC_RemoteRepoRecordAndWatchOverHTTP(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	remoteRepo(t, env, "remote", env.PDS.URL(), env.Account.Handle, env.Account.Password)
	waitRepoReason(t, env, "remote", v1alpha1.ReasonLoggedIn)
	newWatch(t, env, "notes", "remote", noteCollection)
	newRecord(t, env, "over-http", "remote", noteCollection, "over-http", note("via XRPC"))
	rec := waitRecord(t, env, "over-http", v1alpha1.ReasonWritten)
	waitWatch(t, env, "notes", "the record", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, rec.Status.URI, rec.Status.CID)
	})
	// Drift repair and swap semantics hold over HTTP too.
	user := userClient(t, env)
	if _, err := user.PutRecord(ctx, noteCollection, "over-http", note("drifted"), nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "drift repaired over HTTP", func() (bool, error) {
		got, err := env.PDS.Repo(env.Account.DID).Get(ctx, noteCollection, "over-http")
		return err == nil && got.CID == rec.Status.CID, err
	})
	if err := env.Client.Delete(ctx, rec); err != nil {
		t.Fatal(err)
	}
	waitWatch(t, env, "notes", "the deletion", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return wasDeleted(st, rec.Status.URI)
	})
}
