package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// scaleBidder is a `socialweb bidder` process of its own account and state dir, following
// the test's PDS with --follow as bidders of one market do.
type scaleBidder struct {
	*bidderProc
	did, guests string
	sub         substrate.Substrate
}

func startScaleBidder(t *testing.T, env *testenv.Env, handle string, cost, capacity int) *scaleBidder {
	t.Helper()
	ctx := context.Background()
	if _, err := env.PDS.CreateAccount(ctx, handle, "pw-"+handle); err != nil {
		t.Fatal(err)
	}
	did, _, err := env.PDS.Account(ctx, handle)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-"+handle+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	guests := filepath.Join(state, "guests")
	sub, err := deno.New(deno.Config{StateDir: guests})
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	p := &bidderProc{t: t, out: &testenv.LogBuffer{}, state: state, handle: handle,
		args: []string{"bidder", "--pds", env.PDS.URL(), "--identifier", handle, "--password-file", pwFile, "--state-dir", state,
			"--cost", strconv.Itoa(cost), "--capacity", strconv.Itoa(capacity), "--follow", env.PDS.URL(),
			"--plc-url", env.PDS.PLCURL(), "--log-level", "info"}}
	p.start()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		_ = p.cmd.Wait()
		if t.Failed() {
			t.Logf("bidder %s:\n%s", handle, p.out.String())
		}
	})
	substratetest.Cleanup(t, sub, guests)
	b := &scaleBidder{bidderProc: p, did: did, guests: guests, sub: sub}
	testenv.Eventually(t, 20*time.Second, "the offering of "+handle, func() (bool, error) {
		_, err := b.repo(t, env).Get(ctx, mk.OfferingNSID, "self")
		return err == nil, err
	})
	return b
}

func (b *scaleBidder) repo(t *testing.T, env *testenv.Env) repos.Repo {
	t.Helper()
	r, err := repos.Local(context.Background(), env.PDS, b.did)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// records are the bidder's records of coll.
func (b *scaleBidder) records(t *testing.T, env *testenv.Env, coll string) []repos.Record {
	t.Helper()
	var out []repos.Record
	cursor := ""
	for {
		recs, next, err := b.repo(t, env).List(context.Background(), coll, cursor, 100)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, recs...)
		if next == "" || len(recs) == 0 {
			return out
		}
		cursor = next
	}
}

// bidOn says whether the bidder wrote a bid on rfp.
func (b *scaleBidder) bidOn(t *testing.T, env *testenv.Env, rfp string) bool {
	t.Helper()
	for _, r := range b.records(t, env, mk.BidNSID) {
		var bid mk.Bid
		if err := json.Unmarshal(r.Value, &bid); err != nil {
			t.Fatal(err)
		}
		if bid.RFP.URI == rfp {
			return true
		}
	}
	return false
}

// receipts counts the bidder's receipts of accept.
func (b *scaleBidder) receipts(t *testing.T, env *testenv.Env, accept string) int {
	t.Helper()
	n := 0
	for _, r := range b.records(t, env, mk.ReceiptNSID) {
		var rc mk.Receipt
		if err := json.Unmarshal(r.Value, &rc); err != nil {
			t.Fatal(err)
		}
		if rc.Accept.URI == accept {
			n++
		}
	}
	return n
}

// noBidOnOld waits until the bidder's replay has decided on each of rfps (its log names
// them) and fails on any bid of its on one: they were accepted or closed before it started.
func (b *scaleBidder) noBidOnOld(t *testing.T, env *testenv.Env, rfps map[string]string) {
	t.Helper()
	for name, rfp := range rfps {
		testenv.Eventually(t, 20*time.Second, b.handle+" decided on the rfp of "+name, func() (bool, error) {
			return strings.Contains(b.out.String(), "rfp="+rfp), nil
		})
	}
	for name, rfp := range rfps {
		if b.bidOn(t, env, rfp) {
			t.Errorf("%s bid on the rfp of %s (%s), accepted or closed before it started", b.handle, name, rfp)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// heldEarly requests a contract with a bid window of 20 s and waits until it is Held: well
// within the window, since every bidder the requester waits for bids (want, at least, bids
// seen) and the window closes then.
func heldEarly(t *testing.T, env *testenv.Env, name string, want int, mut ...func(*v1alpha1.ComputeContract)) *v1alpha1.ComputeContract {
	t.Helper()
	const window = 20 * time.Second
	start := time.Now()
	newContract(t, env, name, append([]func(*v1alpha1.ComputeContract){func(c *v1alpha1.ComputeContract) {
		c.Spec.PolicyArgs["bidWindowSec"] = strconv.Itoa(int(window / time.Second))
	}}, mut...)...)
	c := waitContract(t, env, name, v1alpha1.ComputeContractHeld)
	took := time.Since(start)
	if took > window/2 || len(c.Status.Bids) < want {
		t.Fatalf("contract %s Held after %s with %d bids %+v; want %d bids or more and Held well within its %s window (closed early)",
			name, took.Round(time.Millisecond), len(c.Status.Bids), c.Status.Bids, want, window)
	}
	t.Logf("%s Held after %s, %d bids, won by %s", name, time.Since(start).Round(time.Millisecond), len(c.Status.Bids), c.Status.Winner)
	return c
}

// oneWinner checks that exactly the winner of c answered its accept and runs its guest.
func oneWinner(t *testing.T, env *testenv.Env, c *v1alpha1.ComputeContract, bidders ...*scaleBidder) {
	t.Helper()
	id := bidder.GuestID(c.Status.Accept)
	for _, b := range bidders {
		want := 0
		if b.did == c.Status.Winner {
			want = 1
		}
		if n := b.receipts(t, env, c.Status.Accept); n != want {
			t.Fatalf("%s: %d receipts of the accept of %s won by %s, want %d", b.handle, n, c.Name, c.Status.Winner, want)
		}
		gs, err := b.sub.Status(context.Background(), id)
		if runs := err == nil && gs.Phase == substrate.Running; runs != (want == 1) {
			t.Fatalf("%s: guest of %s (won by %s) running %v (%+v, %v)", b.handle, c.Name, c.Status.Winner, runs, gs, err)
		}
	}
}

// Bidders scale out: several `socialweb bidder` processes (own accounts, own state dirs)
// following one PDS. A bidder started after contracts were decided bids on none of their
// rfps (accepted, with their 60 s window still open, or past a 3 s window that no accept
// ended) and its capacity of one is free: a contract only it may win is Held at once. With
// two bidders, then three, each contract is Held well within its 20 s window (every known
// bidder bids, so it closes early), by one winner: only it wrote a receipt and runs the guest.
func TestACC_MarketBiddersScaleOut(t *testing.T) {
	env := marketEnv(t)
	a := startScaleBidder(t, env, "scalea.test", 1, 8)
	rfps := map[string]string{}
	var contracts []string
	for _, name := range []string{"old1", "old2"} {
		newContract(t, env, name, func(c *v1alpha1.ComputeContract) { c.Spec.PolicyArgs["bidWindowSec"] = "60" })
		c := waitContract(t, env, name, v1alpha1.ComputeContractHeld)
		rfps[name] = c.Status.RFP
		contracts = append(contracts, name)
	}
	// Only a DID that never bids may win: a's bid is refused, the window runs out, no accept.
	newContract(t, env, "closed", func(c *v1alpha1.ComputeContract) {
		c.Spec.PolicyArgs["bidWindowSec"] = "3"
		c.Spec.BidderDids = []string{"did:plc:nobodyhere2222222222222"}
	})
	c := waitContract(t, env, "closed", v1alpha1.ComputeContractFailed)
	if c.Status.Accept != "" || !strings.HasPrefix(c.Status.Message, "AllRefused") {
		t.Fatalf("closed: accept %q, message %q; want no accept, AllRefused", c.Status.Accept, c.Status.Message)
	}
	rfps["closed"] = c.Status.RFP

	b := startScaleBidder(t, env, "scaleb.test", 5, 1)
	b.noBidOnOld(t, env, rfps)
	c = heldEarly(t, env, "onlyb", 1, func(c *v1alpha1.ComputeContract) { c.Spec.BidderDids = []string{b.did} })
	if c.Status.Winner != b.did {
		t.Fatalf("onlyb won by %s, want %s", c.Status.Winner, b.did)
	}
	rfps["onlyb"] = c.Status.RFP
	release(t, env, "onlyb")
	waitContract(t, env, "onlyb", v1alpha1.ComputeContractReleased)

	// Two bidders: b (capacity 1) bids on each contract in turn, so the accept of a's bid
	// freed the place its own losing bid held.
	for _, name := range []string{"two1", "two2"} {
		c := heldEarly(t, env, name, 2)
		if c.Status.Winner != a.did {
			t.Fatalf("%s won by %s, want the cheaper %s", name, c.Status.Winner, a.did)
		}
		oneWinner(t, env, c, a, b)
		rfps[name] = c.Status.RFP
		contracts = append(contracts, name)
	}

	cc := startScaleBidder(t, env, "scalec.test", 3, 1)
	cc.noBidOnOld(t, env, rfps)
	three := heldEarly(t, env, "three1", 3)
	if three.Status.Winner != a.did {
		t.Fatalf("three1 won by %s, want %s", three.Status.Winner, a.did)
	}
	oneWinner(t, env, three, a, b, cc)
	// a denied: c (3) wins over b (5); a's bid is refused and the window closes on b's and c's.
	denied := heldEarly(t, env, "three2", 2, func(c *v1alpha1.ComputeContract) { c.Spec.DenyBidderDids = []string{a.did} })
	if denied.Status.Winner != cc.did {
		t.Fatalf("three2 won by %s, want %s", denied.Status.Winner, cc.did)
	}
	oneWinner(t, env, denied, a, b, cc)
	contracts = append(contracts, "three1", "three2")

	for _, name := range contracts {
		release(t, env, name)
	}
	for _, name := range contracts {
		waitContract(t, env, name, v1alpha1.ComputeContractReleased)
	}
	for _, s := range []*scaleBidder{a, b, cc} {
		waitNoProcs(t, s.guests)
	}
	if bids := len(cc.records(t, env, mk.BidNSID)); bids != 2 {
		t.Fatalf("c wrote %d bids, want 2 (three1, three2): %s", bids, fmt.Sprint(cc.records(t, env, mk.BidNSID)))
	}
}
