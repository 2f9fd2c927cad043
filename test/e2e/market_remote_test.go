package e2e

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds/refpds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// A requester whose repo is on another PDS than its bidder's: the ComputeContract's repoRef is
// a remote AtprotoRepo on PDS B (reached over XRPC only), the bidder's account is on PDS A.
// The requester follows A besides its own B (MarketSources), the bidder follows B besides its
// own A (Sources): the contract is won, Held with a running guest, and released.
func TestACC_MarketRemoteRequester(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true}) // A: the bidder's PDS
	other, acct := testenv.StartPDS(t, t.TempDir(), "") // B: the requester's PDS
	remoteMarket(t, env, other.URL(), acct.Handle, acct.Password, acct.DID, env.PDS.URL())
}

// The same with the requester following a relay rather than the bidder's PDS: a stand-in that
// serves A's firehose and refuses every other call, as a relay serves no getRecord. The
// requester reads the bidder's offering, bid, receipt and events from the PDS of the
// bidder's DID document (the embedded PDS's did:plc directory resolves it).
func TestACC_MarketRequesterFollowsRelay(t *testing.T) {
	env := testenv.Start(t, testenv.Options{PDS: true})
	other, acct := testenv.StartPDS(t, t.TempDir(), "")
	target, err := url.Parse(env.PDS.URL())
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(target)
	relay := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/xrpc/com.atproto.sync.subscribeRepos" {
			proxy.ServeHTTP(w, r)
			return
		}
		refused.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotImplemented)
		_, _ = w.Write([]byte(`{"error":"MethodNotImplemented","message":"a relay"}`))
	}))
	t.Cleanup(relay.Close)
	remoteMarket(t, env, other.URL(), acct.Handle, acct.Password, acct.DID, relay.URL)
	if refused.Load() == 0 {
		t.Fatal("no record was asked of the relay: the row does not show the DID-document path")
	}
}

// The same with the requester's repo on the reference PDS (@atproto/pds): its firehose and
// getRecord serve both the requester's index and the bidder. SOCIALWEB_INTEROP=1 runs it.
func TestACC_Interop_MarketRequesterOnReferencePDS(t *testing.T) {
	t.Parallel()
	peer := refpds.Require(t)
	const handle, password = "requester.test", "requester-pw-1"
	sess, err := atclient.New(peer.PDSURL).CreateAccount(context.Background(), handle, password, "requester@example.test")
	if err != nil {
		t.Fatalf("account on the reference PDS: %v", err)
	}
	env := testenv.Start(t, testenv.Options{PDS: true})
	remoteMarket(t, env, peer.PDSURL, handle, password, sess.DID, env.PDS.URL())
}

// remoteMarket runs a contract from a remote AtprotoRepo on service (the requester, did) won
// by a bidder on env's PDS: the bidder follows service, the requester follows follow (env's
// PDS, or a relay of it).
func remoteMarket(t *testing.T, env *testenv.Env, service, identifier, password, did, follow string) {
	t.Helper()
	ctx := context.Background()
	env.MarketSources = []string{follow}
	env.StartControllers(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	remoteRepo(t, env, "owner", service, identifier, password)
	waitRepoReason(t, env, "owner", v1alpha1.ReasonLoggedIn)

	const handle = "farbidder.test"
	if _, err := env.PDS.CreateAccount(ctx, handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := deno.New(deno.Config{StateDir: dir})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	repo, err := repos.Local(ctx, env.PDS, handle)
	if err != nil {
		t.Fatal(err)
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(env.PDS), Sources: feed.Sources([]string{service}, env.PDS, nil),
		Substrate: sub, Cost: 5, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(runCtx) }()
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
	substratetest.Cleanup(t, sub, dir)

	newContract(t, env, "far", func(c *v1alpha1.ComputeContract) { c.Spec.PolicyArgs["bidWindowSec"] = "3" })
	c := waitContract(t, env, "far", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b.DID() {
		t.Fatalf("winner %s, want the bidder on the other PDS %s", c.Status.Winner, b.DID())
	}
	if !strings.HasPrefix(c.Status.RFP, "at://"+did+"/") || !strings.HasPrefix(c.Status.Accept, "at://"+did+"/") ||
		!strings.HasPrefix(c.Status.Receipt, "at://"+b.DID()+"/") {
		t.Fatalf("rfp %s, accept %s (want in %s), receipt %s (want in %s)", c.Status.RFP, c.Status.Accept, did, c.Status.Receipt, b.DID())
	}
	u, _ := infra.ParseATURI(c.Status.Accept)
	if _, err := repos.GetPublic(ctx, service, did, u.Collection.String(), u.Rkey.String()); err != nil {
		t.Fatalf("the accept is not on the requester's PDS: %v", err)
	}
	if n := running(t, &runningBidder{sub: sub}); n != 1 {
		t.Fatalf("%d guests running, want 1", n)
	}
	release(t, env, "far")
	waitContract(t, env, "far", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, dir)
}
