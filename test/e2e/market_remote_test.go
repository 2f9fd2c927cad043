package e2e

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
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
	ctx := context.Background()
	other, acct := testenv.StartPDS(t, t.TempDir(), "") // B: the requester's PDS
	env.MarketSources = []string{env.PDS.URL()}
	env.StartControllers(t, slog.New(slog.NewTextHandler(io.Discard, nil)))
	remoteRepo(t, env, "owner", other.URL(), acct.Handle, acct.Password)
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
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(env.PDS), Sources: feed.Sources([]string{other.URL()}, env.PDS),
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
	if !strings.HasPrefix(c.Status.RFP, "at://"+acct.DID+"/") || !strings.HasPrefix(c.Status.Receipt, "at://"+b.DID()+"/") {
		t.Fatalf("rfp %s (want in %s), receipt %s (want in %s)", c.Status.RFP, acct.DID, c.Status.Receipt, b.DID())
	}
	if got, err := other.Repo(acct.DID).Get(ctx, "com.publicdomainrelay.temp.market.accept", c.Status.Accept[strings.LastIndex(c.Status.Accept, "/")+1:]); err != nil || got == nil {
		t.Fatalf("the accept is not on the requester's PDS: %v", err)
	}
	if n := running(t, &runningBidder{sub: sub}); n != 1 {
		t.Fatalf("%d guests running, want 1", n)
	}
	release(t, env, "far")
	waitContract(t, env, "far", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, dir)
}
