package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/testenv"
)

// plcIdentity is a DID made only by posting a genesis operation to a PLC directory: no
// account on any PDS, a key of its own that signs its own service-auth tokens.
type plcIdentity struct {
	did string
	key *atcrypto.PrivateKeyK256
}

func newPLCIdentity(t *testing.T, plcURL string) *plcIdentity {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	did, op, err := plc.Genesis(key, []string{pub.DIDKey()}, pub.DIDKey(), "stranger.invalid", "http://127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	if err := (&plc.Client{URL: plcURL}).Submit(context.Background(), did, op); err != nil {
		t.Fatal(err)
	}
	return &plcIdentity{did: did, key: key}
}

func (p *plcIdentity) token(t *testing.T, aud, lxm string) string {
	t.Helper()
	m := syntax.NSID(lxm)
	tok, err := auth.SignServiceAuth(syntax.DID(p.did), aud, time.Minute, &m, p.key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// countingPLC is a reverse proxy to a PLC directory that counts the DID documents fetched
// through it.
func countingPLC(t *testing.T, plcURL string) (string, *atomic.Int64) {
	t.Helper()
	u, err := url.Parse(plcURL)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/did:") {
			n.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &n
}

// The allow-list: a gateway serves the DIDs it is given, refuses every other one
// AccountNotAllowed (saying how the operator admits it) without resolving it, and with Open
// serves any DID that resolves, a PLC-only one included.
func TestAccess(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true})
	ctx := context.Background()
	if _, err := env.PDS.CreateAccount(ctx, "second.test", "second-password"); err != nil {
		t.Fatal(err)
	}
	a := login(t, env.PDS.URL(), env.Account.Handle, env.Account.Password)
	b := login(t, env.PDS.URL(), "second.test", "second-password")
	stranger := newPLCIdentity(t, env.PDS.PLCURL())
	plcURL, fetches := countingPLC(t, env.PDS.PLCURL())

	closed := startGatewayCfg(t, env, func(c *gateway.Config) {
		c.Directory = gateway.NewDirectory(plcURL)
		c.Access = gateway.Access{Allow: []string{a.did}}
	})
	create := cluster.CreateClusterNSID
	if got := call(t, closed, create, a.token(t, closed.DID(), create), name{"mine"}, nil); got != "" {
		t.Fatalf("the allowed account's createCluster: %s", got)
	}
	before := fetches.Load()
	for _, c := range []struct {
		who   string
		did   string
		token string
	}{
		{"an account of the same PDS not on the list", b.did, b.token(t, closed.DID(), create)},
		{"a PLC-only DID signing its own token", stranger.did, stranger.token(t, closed.DID(), create)},
	} {
		err := gateway.Call(ctx, closed.URL(), create, c.token, name{"theirs"}, nil)
		xe, ok := err.(*gateway.Error)
		if !ok || xe.Name != gateway.ErrAccountNotAllowed || xe.Status != http.StatusForbidden ||
			!strings.Contains(xe.Message, "--gateway-allow "+c.did) || !strings.Contains(xe.Message, "--gateway-open") {
			t.Errorf("%s: %v, want 403 AccountNotAllowed naming --gateway-allow %s and --gateway-open", c.who, err, c.did)
		}
	}
	if n := fetches.Load() - before; n != 0 {
		t.Errorf("refusing accounts not allowed fetched %d DID document(s), want none", n)
	}
	var list v1alpha1.ClusterList
	if err := env.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Spec.Account != a.did {
		t.Errorf("clusters in the core after the refusals: %d, want only the allowed account's", len(list.Items))
	}

	open := startGatewayCfg(t, env, func(c *gateway.Config) { c.Access = gateway.Access{Open: true} })
	if got := call(t, open, create, stranger.token(t, open.DID(), create), name{"theirs"}, nil); got != "" {
		t.Errorf("an open gateway refused the PLC-only DID: %s", got)
	}
	// Open still needs a DID that resolves: an unknown one is an invalid token.
	ghost := &plcIdentity{did: "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", key: stranger.key}
	if got, msg := callMsg(t, open, create, ghost.token(t, open.DID(), create), name{"x"}, nil); got != gateway.ErrInvalidToken || !strings.HasPrefix(msg, "BadJwtIss") {
		t.Errorf("an open gateway and a DID that does not resolve: %s %q, want InvalidToken BadJwtIss", got, msg)
	}

	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if gw, err := gateway.Start(gateway.Config{Client: c, Directory: gateway.NewDirectory(plcURL),
		Access: gateway.Access{Allow: []string{"not-a-did"}}}); err == nil {
		gw.Close()
		t.Error("a gateway started with an allowed account that is not a DID")
	}
}

// The clusters quota: the (N+1)th cluster of an account is refused QuotaExceeded naming the
// quota and the use; setting an existing one running again is no new cluster; another
// account has its own count; deleting one makes room.
func TestClusterQuota(t *testing.T) {
	f := setup(t)
	gw := startGatewayCfg(t, f.env, func(c *gateway.Config) { c.Quota = quota.Limits{Clusters: 2} })
	create := cluster.CreateClusterNSID
	for _, n := range []string{"q1", "q2"} {
		if got := call(t, gw, create, f.a.token(t, gw.DID(), create), name{n}, nil); got != "" {
			t.Fatalf("createCluster %s within the quota: %s", n, got)
		}
	}
	err := gateway.Call(context.Background(), gw.URL(), create, f.a.token(t, gw.DID(), create), name{"q3"}, nil)
	xe, ok := err.(*gateway.Error)
	if !ok || xe.Name != gateway.ErrQuotaExceeded || xe.Status != http.StatusForbidden ||
		!strings.Contains(xe.Message, "quota clusters") || !strings.Contains(xe.Message, "uses 2 of 2 clusters") {
		t.Fatalf("the third cluster: %v, want 403 QuotaExceeded naming quota clusters and 2 of 2", err)
	}
	var refused v1alpha1.Cluster
	if err := f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: gateway.AccountNamespace(f.a.did), Name: "q3"}, &refused); err == nil {
		t.Error("the refused cluster exists")
	}
	if got := call(t, gw, create, f.a.token(t, gw.DID(), create), name{"q1"}, nil); got != "" {
		t.Errorf("createCluster of a cluster the account holds: %s", got)
	}
	if got := call(t, gw, create, f.b.token(t, gw.DID(), create), name{"q3"}, nil); got != "" {
		t.Errorf("another account's first cluster: %s", got)
	}
	del := cluster.DeleteClusterNSID
	if got := call(t, gw, del, f.a.token(t, gw.DID(), del), name{"q2"}, nil); got != "" {
		t.Fatal(got)
	}
	testenv.Eventually(t, 10*time.Second, "room for a cluster after a delete", func() (bool, error) {
		return call(t, gw, create, f.a.token(t, gw.DID(), create), name{"q3"}, nil) == "", nil
	})
}

// Rate limits: past its burst an account is refused 429 RateLimitExceeded with a
// Retry-After, another account is not; per address, even calls without a token are counted,
// before any look at the token.
func TestRateLimit(t *testing.T) {
	f := setup(t)
	list := cluster.ListClustersNSID
	gw := startGatewayCfg(t, f.env, func(c *gateway.Config) {
		c.RateLimit = gateway.RateLimit{PerIP: rate.Inf, PerDID: rate.Every(time.Minute), PerDIDBurst: 3}
	})
	for i := range 3 {
		if got := call(t, gw, list, f.a.token(t, gw.DID(), list), nil, nil); got != "" {
			t.Fatalf("call %d within the burst: %s", i+1, got)
		}
	}
	err := gateway.Call(context.Background(), gw.URL(), list, f.a.token(t, gw.DID(), list), nil, nil)
	xe, ok := err.(*gateway.Error)
	if !ok || xe.Name != gateway.ErrRateLimitExceeded || xe.Status != http.StatusTooManyRequests || xe.RetryAfter < 50*time.Second {
		t.Errorf("the call past the burst: %v (retry after %v), want 429 RateLimitExceeded, Retry-After about a minute", err, xe)
	}
	if got := call(t, gw, list, f.b.token(t, gw.DID(), list), nil, nil); got != "" {
		t.Errorf("another account after the first one's burst: %s", got)
	}

	perIP := startGatewayCfg(t, f.env, func(c *gateway.Config) {
		c.RateLimit = gateway.RateLimit{PerIP: rate.Every(time.Minute), PerIPBurst: 2, PerDID: rate.Inf}
	})
	for i, want := range []string{gateway.ErrAuthMissing, gateway.ErrAuthMissing, gateway.ErrRateLimitExceeded} {
		if got := call(t, perIP, list, "", nil, nil); got != want {
			t.Errorf("call %d without a token from one address: %s, want %s", i+1, got, want)
		}
	}
	if got := call(t, perIP, list, f.a.token(t, perIP.DID(), list), nil, nil); got != gateway.ErrRateLimitExceeded {
		t.Errorf("a valid token from the same address past its burst: %s, want RateLimitExceeded", got)
	}
}

// The live allow-list: a GatewayAccess in namespace gateway admits accounts without a
// restart, besides the flags' list; taking an account out of it (or deleting it) refuses that
// account again at its next call, and never the flags' accounts. The API refuses an entry
// that is not a DID.
func TestAccessLive(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true})
	ctx := context.Background()
	a := login(t, env.PDS.URL(), env.Account.Handle, env.Account.Password)
	stranger := newPLCIdentity(t, env.PDS.PLCURL())
	gw := startGatewayCfg(t, env, func(c *gateway.Config) {
		c.Access = gateway.Access{Allow: []string{a.did}}
		c.WatchAccess = true
	})
	get := cluster.ListClustersNSID
	answer := func() string {
		got, _ := callMsg(t, gw, get, stranger.token(t, gw.DID(), get), nil, nil)
		return got
	}
	if got := answer(); got != gateway.ErrAccountNotAllowed {
		t.Fatalf("the stranger before any GatewayAccess: %q, want AccountNotAllowed", got)
	}
	bad := &v1alpha1.GatewayAccess{ObjectMeta: metav1.ObjectMeta{Namespace: gateway.AccessNamespace, Name: "bad"},
		Spec: v1alpha1.GatewayAccessSpec{Allow: []string{"not-a-did"}}}
	if err := env.Client.Create(ctx, bad); !apierrors.IsInvalid(err) {
		t.Fatalf("a GatewayAccess allowing not-a-did: %v, want Invalid", err)
	}
	ga := &v1alpha1.GatewayAccess{ObjectMeta: metav1.ObjectMeta{Namespace: gateway.AccessNamespace, Name: "friends"},
		Spec: v1alpha1.GatewayAccessSpec{Allow: []string{stranger.did}}}
	if err := env.Client.Create(ctx, ga); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the stranger admitted by the GatewayAccess", func() (bool, error) {
		got := answer()
		return got == "", fmt.Errorf("call: %q", got)
	})
	ga.Spec.Allow = []string{a.did} // the flags' account listed again changes nothing
	if err := env.Client.Update(ctx, ga); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "the stranger refused again", func() (bool, error) {
		got := answer()
		return got == gateway.ErrAccountNotAllowed, fmt.Errorf("call: %q", got)
	})
	ga.Spec = v1alpha1.GatewayAccessSpec{Open: true}
	if err := env.Client.Update(ctx, ga); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "open: the stranger served", func() (bool, error) {
		got := answer()
		return got == "", fmt.Errorf("call: %q", got)
	})
	if err := env.Client.Delete(ctx, ga); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "deleted: the stranger refused", func() (bool, error) {
		got := answer()
		return got == gateway.ErrAccountNotAllowed, fmt.Errorf("call: %q", got)
	})
	if got, _ := callMsg(t, gw, get, a.token(t, gw.DID(), get), nil, nil); got != "" {
		t.Errorf("the flags' account after the GatewayAccess went: %q", got)
	}

	// A gateway started after a GatewayAccess exists serves it from its first call.
	ga = &v1alpha1.GatewayAccess{ObjectMeta: metav1.ObjectMeta{Namespace: gateway.AccessNamespace, Name: "again"},
		Spec: v1alpha1.GatewayAccessSpec{Allow: []string{stranger.did}}}
	if err := env.Client.Create(ctx, ga); err != nil {
		t.Fatal(err)
	}
	later := startGatewayCfg(t, env, func(c *gateway.Config) {
		c.Access = gateway.Access{Allow: []string{a.did}}
		c.WatchAccess = true
	})
	if got, _ := callMsg(t, later, get, stranger.token(t, later.DID(), get), nil, nil); got != "" {
		t.Errorf("a gateway started after the GatewayAccess, first call: %q", got)
	}
}

func TestAccessFromObjects(t *testing.T) {
	a, invalid := gateway.AccessFromObjects([]v1alpha1.GatewayAccess{
		{Spec: v1alpha1.GatewayAccessSpec{Allow: []string{"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "bob"}}},
		{Spec: v1alpha1.GatewayAccessSpec{Allow: []string{"did:web:example.com"}, Open: true}},
	})
	if len(a.Allow) != 2 || !a.Open || len(invalid) != 1 || invalid[0] != "bob" {
		t.Fatalf("got %+v, invalid %v", a, invalid)
	}
	if a, _ := gateway.AccessFromObjects(nil); len(a.Allow) != 0 || a.Open {
		t.Fatalf("none: %+v", a)
	}
}
