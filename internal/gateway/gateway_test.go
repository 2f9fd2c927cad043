package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/testenv"
)

type account struct {
	did string
	c   *atclient.Client
}

// token asks the account's PDS for a service-auth token for aud and lxm.
func (a *account) token(t *testing.T, aud, lxm string) string {
	t.Helper()
	tok, err := a.c.GetServiceAuth(context.Background(), aud, lxm, 0)
	if err != nil {
		t.Fatalf("getServiceAuth: %v", err)
	}
	return tok
}

type fixture struct {
	env  *testenv.Env
	gw   *gateway.Server
	a, b *account
}

func login(t *testing.T, url, handle, password string) *account {
	t.Helper()
	c := atclient.New(url)
	s, err := c.Login(context.Background(), handle, password)
	if err != nil {
		t.Fatalf("login %s: %v", handle, err)
	}
	return &account{did: s.DID, c: c}
}

// startGateway starts a gateway on the env's core and PDS directory, with clock skew added
// to its token checks.
func startGateway(t *testing.T, env *testenv.Env, skew time.Duration) *gateway.Server {
	t.Helper()
	return startGatewayOpts(t, env, env.PDS.PLCURL(), skew)
}

// startGatewayWith starts a gateway whose callers' DIDs resolve through plcURL.
func startGatewayWith(t *testing.T, env *testenv.Env, plcURL string) *gateway.Server {
	t.Helper()
	return startGatewayOpts(t, env, plcURL, 0)
}

func startGatewayOpts(t *testing.T, env *testenv.Env, plcURL string, skew time.Duration) *gateway.Server {
	t.Helper()
	return startGatewayCfg(t, env, func(cfg *gateway.Config) {
		cfg.Directory = gateway.NewDirectory(plcURL)
		if skew != 0 {
			cfg.Now = func() time.Time { return time.Now().Add(skew) }
		}
	})
}

// startGatewayCfg starts a gateway on the env's core, open to every account, with the
// default rate limits, as edit changes that.
func startGatewayCfg(t *testing.T, env *testenv.Env, edit func(*gateway.Config)) *gateway.Server {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// Open: these rows are about what an account that may call can reach (its own clusters
	// only); who may call at all is TestAccess's.
	cfg := gateway.Config{Client: c, TenantsRoot: t.TempDir(), Access: gateway.Access{Open: true}}
	if env.PDS != nil {
		cfg.Directory = gateway.NewDirectory(env.PDS.PLCURL())
	}
	if edit != nil {
		edit(&cfg)
	}
	gw, err := gateway.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	return gw
}

func setup(t *testing.T) *fixture {
	t.Helper()
	env := testenv.Start(t, testenv.Options{PDS: true})
	if _, err := env.PDS.CreateAccount(context.Background(), "second.test", "second-password"); err != nil {
		t.Fatal(err)
	}
	f := &fixture{env: env, gw: startGateway(t, env, 0)}
	f.a = login(t, env.PDS.URL(), env.Account.Handle, env.Account.Password)
	f.b = login(t, env.PDS.URL(), "second.test", "second-password")
	return f
}

// call calls nsid on gw as the holder of token and returns the XRPC error name ("" on
// success).
func call(t *testing.T, gw *gateway.Server, nsid, token string, in, out any) string {
	t.Helper()
	name, _ := callMsg(t, gw, nsid, token, in, out)
	return name
}

// callMsg is call with the error message.
func callMsg(t *testing.T, gw *gateway.Server, nsid, token string, in, out any) (string, string) {
	t.Helper()
	err := gateway.Call(context.Background(), gw.URL(), nsid, token, in, out)
	var xe *gateway.Error
	switch {
	case err == nil:
		return "", ""
	case errors.As(err, &xe):
		return xe.Name, xe.Message
	}
	t.Fatalf("%s: %v", nsid, err)
	return "", ""
}

func (f *fixture) do(t *testing.T, who *account, nsid string, in, out any) {
	t.Helper()
	if name := call(t, f.gw, nsid, who.token(t, f.gw.DID(), nsid), in, out); name != "" {
		t.Fatalf("%s as %s: %s", nsid, who.did, name)
	}
}

// snapshot is every Cluster in the core with what a call could change.
func (f *fixture) snapshot(t *testing.T) string {
	t.Helper()
	var list v1alpha1.ClusterList
	if err := f.env.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range list.Items {
		fmt.Fprintf(&b, "%s/%s rv=%s running=%v deleting=%v\n", c.Namespace, c.Name, c.ResourceVersion, c.Spec.Running, !c.DeletionTimestamp.IsZero())
	}
	return b.String()
}

type name struct {
	Name string `json:"name"`
}

type secRow struct {
	name  string
	gw    *gateway.Server
	token func() string
	nsid  string
	in    any
	want  string
	why   string // the verifier's reason, at the start of an InvalidToken message
}

// The security table: every refused call answers the right error and changes nothing.
func TestSecurityTable(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a1"}, nil)
	f.do(t, f.b, cluster.CreateClusterNSID, name{"b1"}, nil)
	// An object in A's namespace that belongs to B (made by hand): A must not reach it either.
	planted := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: gateway.AccountNamespace(f.a.did), Name: "planted"},
		Spec: v1alpha1.ClusterSpec{Account: f.b.did, Name: "planted", Running: true}}
	if err := f.env.Client.Create(ctx, planted); err != nil {
		t.Fatal(err)
	}

	skewedAhead := startGateway(t, f.env, 2*time.Hour) // every token looks expired
	skewedBehind := startGateway(t, f.env, -time.Hour) // every token looks issued in the future
	otherKey, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	del := syntax.NSID(cluster.DeleteClusterNSID)

	rows := []secRow{
		{"no token", f.gw, func() string { return "" }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrAuthMissing, ""},
		{"malformed", f.gw, func() string { return "not.a-jwt" }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwt:"},
		{"garbage", f.gw, func() string { return strings.Repeat("x", 100) }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwt:"},
		// Forged for B, not A: a forgery spends its DID's one refetch for 30 s
		// (serviceauth.DefaultRefetchInterval), and A's key rotates below.
		{"bad signature", f.gw, func() string {
			tok, err := auth.SignServiceAuth(syntax.DID(f.b.did), f.gw.DID(), time.Minute, &del, otherKey)
			if err != nil {
				t.Fatal(err)
			}
			return tok
		}, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwtSignature"},
		{"wrong aud", f.gw, func() string { return f.a.token(t, f.env.PDS.ServiceDID(), cluster.DeleteClusterNSID) }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwtAudience"},
		{"wrong lxm", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.ListClustersNSID) }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwtLexiconMethod"},
		{"no lxm", f.gw, func() string { return f.a.token(t, f.gw.DID(), "") }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwtLexiconMethod"},
		{"expired", skewedAhead, func() string { return f.a.token(t, skewedAhead.DID(), cluster.DeleteClusterNSID) }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "JwtExpired"},
		{"future iat", skewedBehind, func() string { return f.a.token(t, skewedBehind.DID(), cluster.DeleteClusterNSID) }, cluster.DeleteClusterNSID, name{"a1"}, gateway.ErrInvalidToken, "BadJwt: jwt issued in the future"},
	}
	for _, nsid := range []string{cluster.DeleteClusterNSID, cluster.ControlPlaneUpNSID, cluster.ControlPlaneDownNSID, cluster.GetKubeconfigNSID, cluster.CreateClusterNSID, cluster.SetPublishInfraNSID, cluster.RevokeIdentityNSID} {
		for _, target := range []string{"b1", "planted"} {
			if nsid == cluster.CreateClusterNSID && target == "b1" {
				continue // A's own namespace has no b1: creating it there is A's own cluster
			}
			var in any = name{target}
			switch nsid {
			case cluster.SetPublishInfraNSID:
				in = map[string]any{"name": target, "publish": true}
			case cluster.RevokeIdentityNSID:
				in = map[string]any{"name": target, "did": f.b.did}
			}
			rows = append(rows, secRow{"A names B's cluster " + target + " in " + nsid, f.gw, func() string { return f.a.token(t, f.gw.DID(), nsid) }, nsid, in, gateway.ErrClusterNotFound, ""})
		}
	}
	for _, target := range []string{"b1", "planted"} {
		apply := map[string]any{"cluster": target, "manifest": json.RawMessage(configMap)}
		rows = append(rows,
			secRow{"A names B's cluster " + target + " in kubectlApplyServerSide", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.KubectlApplyServerSideNSID) },
				cluster.KubectlApplyServerSideNSID, apply, gateway.ErrClusterNotFound, ""},
			secRow{"A names B's cluster " + target + " in getJob", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.GetJobNSID) },
				cluster.GetJobNSID + "?cluster=" + target + "&namespace=default&name=j", nil, gateway.ErrClusterNotFound, ""})
	}
	// A revoked identity: A revokes itself on its own cluster a2 (the deny record; no
	// controller runs here, so the cluster never starts). Every method that acts in a2 is
	// refused with Forbidden before it reads anything there.
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a2"}, nil)
	f.do(t, f.a, cluster.RevokeIdentityNSID, map[string]string{"name": "a2", "did": f.a.did}, nil)
	rows = append(rows,
		secRow{"a revoked identity in getKubeconfig", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.GetKubeconfigNSID) },
			cluster.GetKubeconfigNSID, name{"a2"}, gateway.ErrForbidden, "identity " + f.a.did + " is revoked"},
		secRow{"a revoked identity in kubectlApplyServerSide", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.KubectlApplyServerSideNSID) },
			cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "a2", "manifest": json.RawMessage(configMap)}, gateway.ErrForbidden, "identity " + f.a.did + " is revoked"},
		secRow{"a revoked identity in getJob", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.GetJobNSID) },
			cluster.GetJobNSID + "?cluster=a2&namespace=default&name=j", nil, gateway.ErrForbidden, "identity " + f.a.did + " is revoked"},
		secRow{"A revokes B, no member of a1", f.gw, func() string { return f.a.token(t, f.gw.DID(), cluster.RevokeIdentityNSID) },
			cluster.RevokeIdentityNSID, map[string]any{"name": "a1", "did": f.b.did}, gateway.ErrInvalidRequest, ""},
	)
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			before := f.snapshot(t)
			got, msg := callMsg(t, r.gw, r.nsid, r.token(), r.in, nil)
			if got != r.want || !strings.HasPrefix(msg, r.why) {
				t.Errorf("error %q %q, want %q %q...", got, msg, r.want, r.why)
			}
			if after := f.snapshot(t); after != before {
				t.Errorf("a refused call changed the clusters:\nbefore\n%safter\n%s", before, after)
			}
		})
	}

	t.Run("replayed jti", func(t *testing.T) {
		tok := f.a.token(t, f.gw.DID(), cluster.ControlPlaneDownNSID)
		if got := call(t, f.gw, cluster.ControlPlaneDownNSID, tok, name{"a1"}, nil); got != "" {
			t.Fatalf("first use: %s", got)
		}
		before := f.snapshot(t)
		if got, msg := callMsg(t, f.gw, cluster.ControlPlaneDownNSID, tok, name{"a1"}, nil); got != gateway.ErrInvalidToken || !strings.HasPrefix(msg, "JwtReplayed") {
			t.Errorf("second use: %q %q, want InvalidToken JwtReplayed", got, msg)
		}
		if after := f.snapshot(t); after != before {
			t.Errorf("replay changed the clusters:\n%s\n%s", before, after)
		}
	})

	t.Run("A lists only its own", func(t *testing.T) {
		var out cluster.ListClustersOutput
		f.do(t, f.a, cluster.ListClustersNSID, nil, &out)
		if len(out.Clusters) != 2 || out.Clusters[0].Name != "a1" || out.Clusters[1].Name != "a2" {
			t.Errorf("A's list: %+v", out.Clusters)
		}
	})

	t.Run("the same answer for B's cluster and none", func(t *testing.T) {
		err1 := gateway.Call(ctx, f.gw.URL(), cluster.DeleteClusterNSID, f.a.token(t, f.gw.DID(), cluster.DeleteClusterNSID), name{"planted"}, nil)
		err2 := gateway.Call(ctx, f.gw.URL(), cluster.DeleteClusterNSID, f.a.token(t, f.gw.DID(), cluster.DeleteClusterNSID), name{"nothere"}, nil)
		if strings.ReplaceAll(err1.Error(), "planted", "X") != strings.ReplaceAll(err2.Error(), "nothere", "X") {
			t.Errorf("answers differ: %v / %v", err1, err2)
		}
	})

	t.Run("rotated key", func(t *testing.T) {
		// The gateway has A's current key cached from the calls above.
		old := f.a.token(t, f.gw.DID(), cluster.ListClustersNSID)
		if _, err := f.env.PDS.RotateSigningKey(ctx, f.a.did); err != nil {
			t.Fatal(err)
		}
		// A token signed with the new key fails against the cached one; the key is looked
		// up afresh and the token accepted.
		if got := call(t, f.gw, cluster.ListClustersNSID, f.a.token(t, f.gw.DID(), cluster.ListClustersNSID), nil, nil); got != "" {
			t.Errorf("token signed with the rotated key: %s", got)
		}
		before := f.snapshot(t)
		if got, msg := callMsg(t, f.gw, cluster.ListClustersNSID, old, nil, nil); got != gateway.ErrInvalidToken || !strings.HasPrefix(msg, "BadJwtSignature") {
			t.Errorf("token signed with the old key: %q %q, want InvalidToken BadJwtSignature", got, msg)
		}
		if after := f.snapshot(t); after != before {
			t.Errorf("changed:\n%s\n%s", before, after)
		}
	})
}

const configMap = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}`

// Bad input is refused with InvalidRequest (or BadExpiration, ClusterNotReady), never a
// panic or a 500.
func TestBadInput(t *testing.T) {
	f := setup(t)
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a1"}, nil)
	// The rows come faster than an account's rate: a 429 is waited out as its Retry-After
	// says, as a client does, so each row sees the answer to its input.
	raw := func(nsid, method, body string) (int, string) {
		var resp *http.Response
		for {
			req, _ := http.NewRequest(method, f.gw.URL()+"/xrpc/"+nsid, strings.NewReader(body))
			lxm, _, _ := strings.Cut(nsid, "?")
			req.Header.Set("Authorization", "Bearer "+f.a.token(t, f.gw.DID(), lxm))
			var err error
			if resp, err = http.DefaultClient.Do(req); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusTooManyRequests {
				break
			}
			resp.Body.Close()
			wait, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
			time.Sleep(time.Duration(max(wait, 1)) * time.Second)
		}
		defer resp.Body.Close()
		var e struct{ Error string }
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &e)
		return resp.StatusCode, e.Error
	}
	rows := []struct {
		nsid, method, body string
		status             int
		want               string
	}{
		{cluster.CreateClusterNSID, "POST", `{`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", ``, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `[]`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{}`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{"name":7}`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{"name":"Upper"}`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{"name":"` + strings.Repeat("a", 64) + `"}`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{"name":"a1"} {}`, 400, gateway.ErrInvalidRequest},
		{cluster.CreateClusterNSID, "POST", `{"name":"` + strings.Repeat("a", 70000) + `"}`, 413, gateway.ErrPayloadTooLarge},
		{cluster.CreateClusterNSID, "GET", ``, 405, gateway.ErrInvalidRequest},
		{cluster.ListClustersNSID, "POST", `{}`, 405, gateway.ErrInvalidRequest},
		{cluster.GetKubeconfigNSID, "POST", `{"name":"a1","ttlSeconds":59}`, 400, gateway.ErrInvalidRequest},
		{cluster.GetKubeconfigNSID, "POST", `{"name":"a1","ttlSeconds":86401}`, 400, gateway.ErrInvalidRequest},
		{cluster.GetKubeconfigNSID, "POST", `{"name":"a1","ttlSeconds":1.5}`, 400, gateway.ErrInvalidRequest},
		{cluster.GetKubeconfigNSID, "POST", `{"name":"a1","ttlSeconds":600,"noExpiry":true}`, 400, gateway.ErrBadExpiration},
		// No controller runs here: a1 has never started, so it has no server and no CA.
		{cluster.GetKubeconfigNSID, "POST", `{"name":"a1"}`, 400, gateway.ErrClusterNotReady},
		{cluster.GetKubeconfigNSID, "POST", `{"name":"none"}`, 400, gateway.ErrClusterNotFound},
		{"com.example.nothing", "POST", `{}`, 501, gateway.ErrMethodNotFound},
		{cluster.SetPublishInfraNSID, "POST", `{"name":"a1"}`, 400, gateway.ErrInvalidRequest},
		{cluster.SetPublishInfraNSID, "POST", `{"name":"a1","publish":"yes"}`, 400, gateway.ErrInvalidRequest},
		{cluster.SetPublishInfraNSID, "POST", `{"name":"none","publish":true}`, 400, gateway.ErrClusterNotFound},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":` + configMap + `}`, 400, gateway.ErrClusterNotReady},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"none","manifest":` + configMap + `}`, 400, gateway.ErrClusterNotFound},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1"}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":"x"}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":null}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":{"kind":"ConfigMap","metadata":{"name":"x"}}}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":{"apiVersion":"v1","kind":"ConfigMap"}}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"a1","manifest":{"apiVersion":"v1","kind":"List","items":[]}}`, 400, gateway.ErrInvalidRequest},
		{cluster.KubectlApplyServerSideNSID, "POST", `{"cluster":"Bad","manifest":` + configMap + `}`, 400, gateway.ErrInvalidRequest},
		{cluster.GetJobNSID + "?cluster=a1&namespace=default&name=j", "GET", ``, 400, gateway.ErrClusterNotReady},
		{cluster.GetJobNSID + "?cluster=none&namespace=default&name=j", "GET", ``, 400, gateway.ErrClusterNotFound},
		{cluster.GetJobNSID + "?cluster=a1&namespace=default&name=j&tailLines=-1", "GET", ``, 400, gateway.ErrInvalidRequest},
		{cluster.GetJobNSID + "?cluster=a1&namespace=default&name=j&tailLines=x", "GET", ``, 400, gateway.ErrInvalidRequest},
		{cluster.GetJobNSID + "?cluster=a1&name=j", "GET", ``, 400, gateway.ErrInvalidRequest},
		{cluster.GetJobNSID + "?cluster=a1&namespace=default", "GET", ``, 400, gateway.ErrInvalidRequest},
		{cluster.GetJobNSID, "GET", ``, 400, gateway.ErrInvalidRequest},
		{cluster.RevokeIdentityNSID, "POST", `{"name":"a1"}`, 400, gateway.ErrInvalidRequest},
		{cluster.RevokeIdentityNSID, "POST", `{"name":"a1","did":"not-a-did"}`, 400, gateway.ErrInvalidRequest},
		{cluster.RevokeIdentityNSID, "POST", `{"name":"a1","did":7}`, 400, gateway.ErrInvalidRequest},
		{cluster.RevokeIdentityNSID, "POST", `{"did":"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}`, 400, gateway.ErrInvalidRequest},
		{cluster.RevokeIdentityNSID, "POST", `{"name":"none","did":"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}`, 400, gateway.ErrClusterNotFound},
		{cluster.RevokeIdentityNSID, "POST", `{"name":"a1","did":"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}`, 400, gateway.ErrInvalidRequest},
	}
	for _, r := range rows {
		t.Run(r.nsid+" "+r.method+" "+r.body[:min(len(r.body), 60)], func(t *testing.T) {
			status, name := raw(r.nsid, r.method, r.body)
			if status != r.status || name != r.want {
				t.Errorf("%d %s, want %d %s", status, name, r.status, r.want)
			}
		})
	}
}

// The service DID document names the gateway's endpoint, and the DID is its host:port
// (localhost for a loopback address).
func TestDIDDocument(t *testing.T) {
	f := setup(t)
	resp, err := http.Get(f.gw.URL() + "/.well-known/did.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		ID      string `json:"id"`
		Service []struct {
			ID, Type, ServiceEndpoint string
		} `json:"service"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(f.gw.URL(), "http://")
	_, port, _ := strings.Cut(host, ":")
	if doc.ID != "did:web:localhost%3A"+port || doc.ID != f.gw.DID() ||
		len(doc.Service) != 1 || doc.Service[0].ServiceEndpoint != f.gw.URL() || doc.Service[0].ID != "#socialweb_gateway" {
		t.Errorf("DID document %+v for %s", doc, f.gw.URL())
	}
	if !strings.HasPrefix(host, "127.0.0.1:") {
		t.Errorf("gateway listens on %s", host)
	}
	// A token for DID#socialweb_gateway is accepted too.
	tok := f.a.token(t, f.gw.DID()+"#socialweb_gateway", cluster.ListClustersNSID)
	if got := call(t, f.gw, cluster.ListClustersNSID, tok, nil, nil); got != "" {
		t.Errorf("aud with the service fragment: %s", got)
	}
}

func TestDIDForURL(t *testing.T) {
	for _, r := range []struct{ url, want string }{
		{"http://127.0.0.1:8080", "did:web:localhost%3A8080"},
		{"http://[::1]:8080/", "did:web:localhost%3A8080"},
		{"http://localhost:1", "did:web:localhost%3A1"},
		{"https://k8s.example.com", "did:web:k8s.example.com"},
		{"https://k8s.example.com:8443", ""},
		{"not a url", ""},
		{"", ""},
	} {
		got, err := gateway.DIDForURL(r.url)
		if got != r.want || (err == nil) != (r.want != "") {
			t.Errorf("DIDForURL(%q) = %q, %v; want %q", r.url, got, err, r.want)
		}
	}
}

// setPublishInfra writes spec.publishInfra of the caller's cluster and answers its input.
func TestSetPublishInfra(t *testing.T) {
	f := setup(t)
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a1"}, nil)
	for _, publish := range []bool{true, true, false} {
		var out cluster.SetPublishInfraOutput
		f.do(t, f.a, cluster.SetPublishInfraNSID, map[string]any{"name": "a1", "publish": publish}, &out)
		var c v1alpha1.Cluster
		if err := f.env.Client.Get(context.Background(), client.ObjectKey{Namespace: gateway.AccountNamespace(f.a.did), Name: "a1"}, &c); err != nil {
			t.Fatal(err)
		}
		if out.Name != "a1" || out.Publish != publish || c.Spec.PublishInfra != publish {
			t.Errorf("publish %v: answered %+v, stored %v", publish, out, c.Spec.PublishInfra)
		}
	}
}

// revokeIdentity: the deny record (spec.members, the DID Revoked) is written and kept; the
// answer names the identity's ServiceAccount; a second call answers the same and writes
// nothing; the revoked owner may still manage the cluster object (list, stop, delete) but
// no longer act in it.
func TestRevokeIdentity(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a1"}, nil)
	key := client.ObjectKey{Namespace: gateway.AccountNamespace(f.a.did), Name: "a1"}
	var first cluster.RevokeIdentityOutput
	f.do(t, f.a, cluster.RevokeIdentityNSID, map[string]string{"name": "a1", "did": f.a.did}, &first)
	if len(first.Revoked) != 1 || first.Revoked[0].State != "Revoked" || !strings.HasPrefix(first.Revoked[0].Name, "serviceaccount/socialweb-system/account-") {
		t.Fatalf("answer %+v", first)
	}
	var c v1alpha1.Cluster
	if err := f.env.Client.Get(ctx, key, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Spec.Members) != 1 || c.Spec.Members[0].Did != f.a.did || c.Spec.Members[0].State != v1alpha1.MemberRevoked || c.Spec.Members[0].RevokedAt == nil {
		t.Fatalf("members %+v", c.Spec.Members)
	}
	var again cluster.RevokeIdentityOutput
	f.do(t, f.a, cluster.RevokeIdentityNSID, map[string]string{"name": "a1", "did": f.a.did}, &again)
	var c2 v1alpha1.Cluster
	if err := f.env.Client.Get(ctx, key, &c2); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(again) != fmt.Sprint(first) || c2.ResourceVersion != c.ResourceVersion {
		t.Errorf("second revoke: %+v (rv %s -> %s)", again, c.ResourceVersion, c2.ResourceVersion)
	}
	var list cluster.ListClustersOutput
	f.do(t, f.a, cluster.ListClustersNSID, nil, &list)
	f.do(t, f.a, cluster.ControlPlaneDownNSID, name{"a1"}, nil)
	if len(list.Clusters) != 1 {
		t.Errorf("list %+v", list)
	}
	// B cannot revoke on A's cluster, nor learn whether it exists.
	if got := call(t, f.gw, cluster.RevokeIdentityNSID, f.b.token(t, f.gw.DID(), cluster.RevokeIdentityNSID), map[string]string{"name": "a1", "did": f.a.did}, nil); got != gateway.ErrClusterNotFound {
		t.Errorf("B revoking on A's cluster: %s", got)
	}
	f.do(t, f.a, cluster.DeleteClusterNSID, name{"a1"}, nil)
}
