package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// The market's failure rows: a guest that never starts, a bidder lost during a release, and a
// requester killed between its accept and the receipt.

// neverStarts is a deno substrate whose guests never say they run: the process is real and
// up, but Status reports it Booting, as a guest stuck in its boot would be. The bidder then
// never writes vm.started.
type neverStarts struct{ substrate.Substrate }

func (s neverStarts) Status(ctx context.Context, id string) (substrate.GuestStatus, error) {
	gs, err := s.Substrate.Status(ctx, id)
	if err == nil && gs.Phase == substrate.Running {
		gs.Phase = substrate.Booting
	}
	return gs, err
}

func contractNow(t *testing.T, env *testenv.Env, name string) *v1alpha1.ComputeContract {
	t.Helper()
	var c v1alpha1.ComputeContract
	if err := env.Client.Get(context.Background(), key(name), &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// A winner whose guest never reports vm.started within vmReadyTimeoutSec: the contract is
// Failed with reason VMReadyTimeout naming the winner, the delete is written, and the bidder
// releases the guest (no process left).
func TestACC_MarketVMReadyTimeout(t *testing.T) {
	env := marketEnv(t)
	if _, err := env.PDS.CreateAccount(context.Background(), "slow.test", "pw-slow"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := deno.New(deno.Config{StateDir: dir})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	substratetest.Cleanup(t, sub, dir)
	b := runBidderOn(t, env, "slow.test", 5, neverStarts{sub}, dir)
	newContract(t, env, "slow", func(c *v1alpha1.ComputeContract) {
		timeout := int32(2)
		c.Spec.VMReadyTimeoutSec = &timeout
	})
	c := waitContract(t, env, "slow", v1alpha1.ComputeContractFailed)
	if !strings.HasPrefix(c.Status.Message, "VMReadyTimeout: ") || !strings.Contains(c.Status.Message, b.DID()) {
		t.Fatalf("message %q, want VMReadyTimeout naming %s", c.Status.Message, b.DID())
	}
	if cond := meta.FindStatusCondition(c.Status.Conditions, "Ready"); cond == nil || cond.Reason != "VMReadyTimeout" {
		t.Fatalf("conditions %+v, want Ready False VMReadyTimeout", c.Status.Conditions)
	}
	if c.Status.Receipt == "" || lastEvent(c, "delete") == nil {
		t.Fatalf("status %s: want the receipt bound and the delete written", statusJSON(c.Status))
	}
	if lastEvent(c, "vm.started") != nil {
		t.Fatal("vm.started recorded for a guest that never started")
	}
	waitNoProcs(t, dir)
	if n := running(t, b); n != 0 {
		t.Fatalf("%d guests left", n)
	}
}

func lastEvent(c *v1alpha1.ComputeContract, typ string) *v1alpha1.ContractEvent {
	for i := len(c.Status.Events) - 1; i >= 0; i-- {
		if c.Status.Events[i].Type == typ {
			return &c.Status.Events[i]
		}
	}
	return nil
}

// A bidder lost after the release was sent: the contract does not wait forever, it is Failed
// BidderLost once answerTimeoutSec passed after the delete. The bidder, back later, finds the
// delete and stops the guest.
func TestACC_MarketBidderLostOnRelease(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "gone", func(c *v1alpha1.ComputeContract) { c.Spec.PolicyArgs["answerTimeoutSec"] = "3" })
	waitContract(t, env, "gone", v1alpha1.ComputeContractHeld)
	b.stop()
	start := time.Now()
	release(t, env, "gone")
	c := waitContract(t, env, "gone", v1alpha1.ComputeContractFailed)
	took := time.Since(start)
	if !strings.HasPrefix(c.Status.Message, "BidderLost: ") || lastEvent(c, "delete") == nil {
		t.Fatalf("status %s: want BidderLost after the delete", statusJSON(c.Status))
	}
	// Never before answerTimeoutSec after the delete (written after the release call), and
	// bounded: within a second of it plus a reconcile.
	if took < 3*time.Second || took > 15*time.Second {
		t.Fatalf("Failed %s after the release; want it at answerTimeoutSec (3 s) after the delete", took)
	}
	t.Logf("Failed BidderLost %s after the release (answerTimeoutSec 3 s)", took.Round(10*time.Millisecond))
	if running(t, b) != 1 {
		t.Fatal("the guest did not outlive its bidder")
	}
	// The bidder comes back: it finds the requester's delete and stops the guest.
	runBidder(t, env, "bidder1.test", 5, b.stateDir)
	waitNoProcs(t, b.stateDir)
}

// A requester (the core and its controllers) killed after its accept and before the winner's
// receipt: started again on the same data dir it resumes from its status and the records,
// binds the receipt written while it was down, and is Held with one accept only.
func TestACC_MarketRequesterRestartAfterAccept(t *testing.T) {
	srv, acct := testenv.StartPDS(t, t.TempDir(), "")
	dataDir := t.TempDir()
	env := testenv.Start(t, testenv.Options{Controllers: true, PDSServer: srv, DataDir: dataDir})
	env.Account = acct
	localRepo(t, env, "owner")
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "c1", func(c *v1alpha1.ComputeContract) {
		// An allowed DID that never bids keeps the window open to its deadline.
		c.Spec.BidderDids = []string{b.DID(), "did:plc:nobodyhere2222222222222"}
		c.Spec.PolicyArgs["bidWindowSec"] = "3"
		c.Spec.PolicyArgs["answerTimeoutSec"] = "60"
	})
	testenv.Eventually(t, 10*time.Second, "bid seen", func() (bool, error) {
		return len(contractNow(t, env, "c1").Status.Bids) == 1, nil
	})
	// The winner is away, so no receipt can come before the requester is killed.
	b.stop()
	testenv.Eventually(t, 15*time.Second, "accept written", func() (bool, error) {
		return contractNow(t, env, "c1").Status.Accept != "", nil
	})
	c := contractNow(t, env, "c1")
	if c.Status.Receipt != "" || c.Status.Winner != b.DID() {
		t.Fatalf("status %s: want an accept of %s and no receipt", statusJSON(c.Status), b.DID())
	}
	accept := c.Status.Accept
	env.Stop()
	// While the requester is down the winner comes back, boots and writes its receipt.
	b2 := runBidder(t, env, "bidder1.test", 5, b.stateDir)
	testenv.Eventually(t, 15*time.Second, "the guest booted while the requester is down", func() (bool, error) {
		return running(t, b2) == 1, nil
	})
	env = testenv.Start(t, testenv.Options{Controllers: true, PDSServer: srv, DataDir: dataDir})
	env.Account = acct
	c = waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	if c.Status.Accept != accept || c.Status.Winner != b.DID() || c.Status.Receipt == "" {
		t.Fatalf("status %s: want the same accept %s bound", statusJSON(c.Status), accept)
	}
	var accepts int
	for _, e := range c.Status.Events {
		if e.Type == "accept" {
			accepts++
		}
	}
	recs, _, err := srv.Repo(acct.DID).List(context.Background(), mk.AcceptNSID, 100, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if accepts != 1 || len(recs) != 1 || running(t, b2) != 1 {
		t.Fatalf("%d accept events, %d accept records, %d guests; want 1, 1, 1", accepts, len(recs), running(t, b2))
	}
	release(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, b.stateDir)
}
