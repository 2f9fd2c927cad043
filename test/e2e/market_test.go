package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// A guest that runs until it is stopped.
const foreverGuest = `console.log("guest up"); setInterval(() => {}, 1000);`

type runningBidder struct {
	*bidder.Bidder
	sub      substrate.Substrate
	stateDir string
}

// startBidder runs a bidder with its own account on the test's PDS and a deno substrate in
// its own state dir; at cleanup it stops and no guest process of that dir may be left.
func startBidder(t *testing.T, env *testenv.Env, handle string, cost int64) *runningBidder {
	t.Helper()
	ctx := context.Background()
	if _, err := env.PDS.CreateAccount(ctx, handle, "pw-"+handle); err != nil {
		t.Fatalf("account %s: %v", handle, err)
	}
	repo, err := repos.Local(ctx, env.PDS, handle)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "guests")
	sub, err := deno.New(deno.Config{StateDir: dir})
	if err != nil {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	if _, err := exec_lookup(sub); err != nil {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(env.PDS), Substrate: sub, Cost: cost,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if pids := substratetest.Procs(dir); len(pids) != 0 {
			t.Errorf("bidder %s: guest processes left before cleanup: %v", handle, pids)
		}
	})
	substratetest.Cleanup(t, sub, dir)
	return &runningBidder{Bidder: b, sub: sub, stateDir: dir}
}

func exec_lookup(s *deno.Substrate) (string, error) {
	if s.Binary() == "" {
		return "", fmt.Errorf("no deno")
	}
	return s.Binary(), nil
}

func newContract(t *testing.T, env *testenv.Env, name string, mut ...func(*v1alpha1.ComputeContract)) {
	t.Helper()
	c := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.ComputeContractSpec{VMName: name, ComputeKind: "deno", UserData: foreverGuest,
			RepoRef: &v1alpha1.ObjectRef{Name: "owner"}, PolicyArgs: map[string]string{"bidWindowSec": "5", "answerTimeoutSec": "10"}}}
	for _, m := range mut {
		m(c)
	}
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func waitContract(t *testing.T, env *testenv.Env, name string, phase v1alpha1.ComputeContractPhase) *v1alpha1.ComputeContract {
	t.Helper()
	var c v1alpha1.ComputeContract
	testenv.Eventually(t, 30*time.Second, "ComputeContract "+name+" "+string(phase), func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &c); err != nil {
			return false, err
		}
		if c.Status.Phase != phase && (c.Status.Phase == v1alpha1.ComputeContractFailed || c.Status.Phase == v1alpha1.ComputeContractReleased) {
			t.Fatalf("contract %s ended %s: %s", name, c.Status.Phase, c.Status.Message)
		}
		return c.Status.Phase == phase, fmt.Errorf("phase %s: %s", c.Status.Phase, c.Status.Message)
	})
	return &c
}

func running(t *testing.T, b *runningBidder) int {
	t.Helper()
	gs, err := b.sub.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range gs {
		if !g.Phase.Ended() {
			n++
		}
	}
	return n
}

func release(t *testing.T, env *testenv.Env, name string) {
	t.Helper()
	var c v1alpha1.ComputeContract
	if err := env.Client.Get(context.Background(), key(name), &c); err != nil {
		t.Fatal(err)
	}
	c.Spec.Release = &v1alpha1.ContractRelease{RequestedAt: metav1.Now(), Reason: "test done"}
	if err := env.Client.Update(context.Background(), &c); err != nil {
		t.Fatal(err)
	}
}

func marketEnv(t *testing.T) *testenv.Env {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	localRepo(t, env, "owner")
	return env
}

// A Requested contract is won by the local bidder, Held with a running deno guest; a release
// makes it Released with no guest process left.
func TestACC_MarketRequestDeployRelease(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "c1")
	c := waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b.DID() || c.Status.Receipt == "" || c.Status.Accept == "" || c.Status.RFP == "" {
		t.Fatalf("status: %+v", c.Status)
	}
	if n := running(t, b); n != 1 {
		t.Fatalf("%d guests running, want 1", n)
	}
	if len(substratetest.Procs(b.stateDir)) == 0 {
		t.Fatal("no guest process while Held")
	}
	release(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractReleased)
	testenv.Eventually(t, 10*time.Second, "no guest process", func() (bool, error) {
		return len(substratetest.Procs(b.stateDir)) == 0, nil
	})
}

// Three bidders with different prices: the cheapest wins; denied, the next cheapest does.
func TestACC_MarketCheapestWinsAndDeny(t *testing.T) {
	env := marketEnv(t)
	b30 := startBidder(t, env, "b30.test", 30)
	b10 := startBidder(t, env, "b10.test", 10)
	b20 := startBidder(t, env, "b20.test", 20)
	newContract(t, env, "cheap", func(c *v1alpha1.ComputeContract) { c.Spec.PolicyArgs["bidWindowSec"] = "3" })
	c := waitContract(t, env, "cheap", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b10.DID() {
		t.Fatalf("winner %s, want the cheapest %s (bids %+v)", c.Status.Winner, b10.DID(), c.Status.Bids)
	}
	newContract(t, env, "deny", func(c *v1alpha1.ComputeContract) {
		c.Spec.PolicyArgs["bidWindowSec"] = "3"
		c.Spec.DenyBidderDids = []string{b10.DID()}
	})
	c = waitContract(t, env, "deny", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b20.DID() {
		t.Fatalf("winner %s, want %s with %s denied", c.Status.Winner, b20.DID(), b10.DID())
	}
	if running(t, b30) != 0 {
		t.Fatal("the dearest bidder runs a guest")
	}
	release(t, env, "cheap")
	release(t, env, "deny")
	waitContract(t, env, "cheap", v1alpha1.ComputeContractReleased)
	waitContract(t, env, "deny", v1alpha1.ComputeContractReleased)
	for _, b := range []*runningBidder{b10, b20, b30} {
		testenv.Eventually(t, 10*time.Second, "no guest process of "+b.DID(), func() (bool, error) {
			pids := substratetest.Procs(b.stateDir)
			var cmds []string
			for _, p := range pids {
				c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				cmds = append(cmds, strings.ReplaceAll(string(c), "\x00", " "))
			}
			return len(pids) == 0, fmt.Errorf("%v", cmds)
		})
	}
}

// A policy the bidder refuses (only_me: only the requester's own account may win): no bid,
// Failed naming it, nothing booted.
func TestACC_MarketPolicyRefuses(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "mine", func(c *v1alpha1.ComputeContract) { c.Spec.Policy = "only_me" })
	c := waitContract(t, env, "mine", v1alpha1.ComputeContractFailed)
	if !strings.HasPrefix(c.Status.Message, "NoBids: ") || !strings.Contains(c.Status.Message, "onlyMe") {
		t.Fatalf("message %q does not name the refusal", c.Status.Message)
	}
	if running(t, b) != 0 {
		t.Fatal("a guest runs for a refused contract")
	}
}
