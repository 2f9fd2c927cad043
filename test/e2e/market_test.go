package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
	stop     func()
}

// startBidder runs a bidder with its own account on the test's PDS and a deno substrate in
// its own state dir; at cleanup it stops and no guest process of that dir may be left.
func startBidder(t *testing.T, env *testenv.Env, handle string, cost int64) *runningBidder {
	t.Helper()
	return startBidderWith(t, env, handle, cost, deno.Config{})
}

// startBidderWith is startBidder with the substrate's config (its StateDir is the test's).
func startBidderWith(t *testing.T, env *testenv.Env, handle string, cost int64, cfg deno.Config) *runningBidder {
	t.Helper()
	if _, err := env.PDS.CreateAccount(context.Background(), handle, "pw-"+handle); err != nil {
		t.Fatalf("account %s: %v", handle, err)
	}
	cfg.StateDir = filepath.Join(t.TempDir(), "guests")
	b := runBidderWith(t, env, handle, cost, cfg)
	substratetest.Cleanup(t, b.sub, b.stateDir)
	return b
}

// runBidder runs a bidder for an existing account over stateDir until stop (or cleanup).
func runBidder(t *testing.T, env *testenv.Env, handle string, cost int64, dir string) *runningBidder {
	t.Helper()
	return runBidderWith(t, env, handle, cost, deno.Config{StateDir: dir})
}

// runBidderWith is runBidder with the substrate's config.
func runBidderWith(t *testing.T, env *testenv.Env, handle string, cost int64, cfg deno.Config) *runningBidder {
	t.Helper()
	sub, err := deno.New(cfg)
	if err != nil || sub.Binary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	return runBidderOn(t, env, handle, cost, sub, cfg.StateDir)
}

// bidderCapacity is the capacity of the bidders the tests start.
var bidderCapacity = 8

// runBidderOn runs a bidder for an existing account with guests on sub (state in dir).
func runBidderOn(t *testing.T, env *testenv.Env, handle string, cost int64, sub substrate.Substrate, dir string) *runningBidder {
	t.Helper()
	ctx := context.Background()
	repo, err := repos.Local(ctx, env.PDS, handle)
	if err != nil {
		t.Fatal(err)
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(env.PDS), Substrate: sub, Cost: cost, Capacity: bidderCapacity,
		Directory: env.PDS.Directory(), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(runCtx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &runningBidder{Bidder: b, sub: sub, stateDir: dir, stop: stop}
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
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Release = &v1alpha1.ContractRelease{RequestedAt: metav1.Now(), Reason: "test done"}
	if err := env.Client.Patch(context.Background(), &c, patch); err != nil {
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
	// vm.onNetwork follows vm.started.
	testenv.Eventually(t, 10*time.Second, "guest address", func() (bool, error) {
		if err := env.Client.Get(context.Background(), key("c1"), c); err != nil {
			return false, err
		}
		return c.Status.Guest != nil && c.Status.Guest.Address == "127.0.0.1", fmt.Errorf("guest %+v", c.Status.Guest)
	})
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

func waitNoProcs(t *testing.T, dir string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "no guest process in "+dir, func() (bool, error) {
		pids := substratetest.Procs(dir)
		return len(pids) == 0, fmt.Errorf("pids %v", pids)
	})
}

// A bidder restarted while it holds a guest finds the guest again from its repo and state
// dir, and releases it when asked.
func TestACC_MarketBidderRestart(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	b.stop()
	if running(t, b) != 1 {
		t.Fatal("the guest did not outlive its bidder")
	}
	b2 := runBidder(t, env, "bidder1.test", 5, b.stateDir)
	release(t, env, "c1")
	c := waitContract(t, env, "c1", v1alpha1.ComputeContractReleased)
	if c.Status.Winner != b2.DID() {
		t.Fatalf("winner %s", c.Status.Winner)
	}
	waitNoProcs(t, b.stateDir)
}

// Deleting a Held contract releases its guest before the object goes (the finalizer).
func TestACC_MarketDeleteReleases(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "c1")
	c := waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	if err := env.Client.Delete(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "contract gone", func() (bool, error) {
		err := env.Client.Get(context.Background(), key("c1"), &v1alpha1.ComputeContract{})
		return apierrors.IsNotFound(err), err
	})
	waitNoProcs(t, b.stateDir)
}

// A winner that dies after its bid never answers the accept: the contract fails naming it,
// and a later request is won by another bidder.
func TestACC_MarketLostWinner(t *testing.T) {
	t.Parallel()
	env := marketEnv(t)
	cheap := startBidder(t, env, "cheap.test", 1)
	dear := startBidder(t, env, "dear.test", 9)
	// A third allowed DID that never bids keeps the window open to its deadline.
	allow := []string{cheap.DID(), dear.DID(), "did:plc:nobodyhere2222222222222"}
	newContract(t, env, "lost", func(c *v1alpha1.ComputeContract) {
		c.Spec.BidderDids = allow
		c.Spec.PolicyArgs["bidWindowSec"] = "3"
		c.Spec.PolicyArgs["answerTimeoutSec"] = "2"
	})
	testenv.Eventually(t, 10*time.Second, "both bids seen", func() (bool, error) {
		var c v1alpha1.ComputeContract
		if err := env.Client.Get(context.Background(), key("lost"), &c); err != nil {
			return false, err
		}
		return len(c.Status.Bids) == 2, nil
	})
	cheap.stop()
	c := waitContract(t, env, "lost", v1alpha1.ComputeContractFailed)
	if !strings.HasPrefix(c.Status.Message, "WinnerSilent: ") || c.Status.Winner != cheap.DID() {
		t.Fatalf("winner %s, message %q", c.Status.Winner, c.Status.Message)
	}
	newContract(t, env, "later")
	c = waitContract(t, env, "later", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != dear.DID() {
		t.Fatalf("later winner %s, want %s", c.Status.Winner, dear.DID())
	}
	release(t, env, "later")
	waitContract(t, env, "later", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, dear.stateDir)
	waitNoProcs(t, cheap.stateDir)
}

// `socialweb bidder` against the PDS's URL with an account's password wins a contract,
// releases it, and leaves no guest when it is stopped.
func TestACC_MarketBidderCommand(t *testing.T) {
	env := marketEnv(t)
	if _, err := env.PDS.CreateAccount(context.Background(), "cli.test", "pw-cli"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("pw-cli\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cmd := exec.Command(socialwebBin, "bidder", "--pds", env.PDS.URL(), "--identifier", "cli.test",
		"--password-file", pwFile, "--state-dir", state, "--cost", "3", "--log-level", "warn")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if pids := substratetest.Procs(filepath.Join(state, "guests")); len(pids) != 0 {
			for _, p := range pids {
				c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				t.Logf("%d: %q", p, c)
			}
			t.Errorf("guest processes left: %v\n%s", pids, out.String())
		}
	})
	newContract(t, env, "c1")
	c := waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	if !strings.Contains(out.String(), c.Status.Winner) {
		t.Fatalf("winner %s is not the command's bidder: %s", c.Status.Winner, out.String())
	}
	release(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, filepath.Join(state, "guests")) // the bidder's own argv names state
}

// A guest that ends by itself is reported by its bidder and the contract completes.
func TestACC_MarketGuestExitEnds(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "short", func(c *v1alpha1.ComputeContract) {
		c.Spec.UserData = `await new Promise((r) => setTimeout(r, 300)); console.log("done");`
	})
	c := waitContract(t, env, "short", v1alpha1.ComputeContractReleased)
	if cond := meta.FindStatusCondition(c.Status.Conditions, "Ready"); cond == nil || cond.Reason != "GuestEnded" {
		t.Fatalf("conditions %+v", c.Status.Conditions)
	}
	waitNoProcs(t, b.stateDir)
}

// A requester (the whole core with its controllers) stopped in the bid window resumes from
// the records and its status: the bid is found again, accepted, and the guest is Held.
func TestACC_MarketRequesterRestart(t *testing.T) {
	srv, acct := testenv.StartPDS(t, t.TempDir(), "")
	dataDir := t.TempDir()
	env := testenv.Start(t, testenv.Options{Controllers: true, PDSServer: srv, DataDir: dataDir})
	env.Account = acct
	localRepo(t, env, "owner")
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "c1", func(c *v1alpha1.ComputeContract) {
		// An allowed DID that never bids keeps the window open to its deadline.
		c.Spec.BidderDids = []string{b.DID(), "did:plc:nobodyhere2222222222222"}
		c.Spec.PolicyArgs["bidWindowSec"] = "4"
	})
	testenv.Eventually(t, 10*time.Second, "bid seen", func() (bool, error) {
		var c v1alpha1.ComputeContract
		if err := env.Client.Get(context.Background(), key("c1"), &c); err != nil {
			return false, err
		}
		return len(c.Status.Bids) == 1, nil
	})
	env.Stop()
	env = testenv.Start(t, testenv.Options{Controllers: true, PDSServer: srv, DataDir: dataDir})
	c := waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	if c.Status.Winner != b.DID() {
		t.Fatalf("winner %s", c.Status.Winner)
	}
	var accepts int
	for _, e := range c.Status.Events {
		if e.Type == "accept" {
			accepts++
		}
	}
	if accepts != 1 || running(t, b) != 1 {
		t.Fatalf("%d accepts, %d guests; want 1 and 1", accepts, running(t, b))
	}
	release(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, b.stateDir)
}

// A bidder bids only within its capacity, counting bids not yet answered: with room for one
// guest, of two contracts requested together one is Held and the other gets no bid.
func TestACC_MarketCapacity(t *testing.T) {
	bidderCapacity = 1
	defer func() { bidderCapacity = 8 }()
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	for _, name := range []string{"a", "b"} {
		newContract(t, env, name, func(c *v1alpha1.ComputeContract) { c.Spec.PolicyArgs["bidWindowSec"] = "3" })
	}
	phases := map[v1alpha1.ComputeContractPhase]int{}
	testenv.Eventually(t, 30*time.Second, "one Held, one Failed", func() (bool, error) {
		phases = map[v1alpha1.ComputeContractPhase]int{}
		for _, name := range []string{"a", "b"} {
			var c v1alpha1.ComputeContract
			if err := env.Client.Get(context.Background(), key(name), &c); err != nil {
				return false, err
			}
			phases[c.Status.Phase]++
			if c.Status.Phase == v1alpha1.ComputeContractFailed && !strings.HasPrefix(c.Status.Message, "NoBids: ") {
				t.Fatalf("%s: %s", name, c.Status.Message)
			}
		}
		return phases[v1alpha1.ComputeContractHeld] == 1 && phases[v1alpha1.ComputeContractFailed] == 1, fmt.Errorf("%v", phases)
	})
	if running(t, b) != 1 {
		t.Fatalf("%d guests, want 1", running(t, b))
	}
	for _, name := range []string{"a", "b"} {
		release(t, env, name)
	}
	waitNoProcs(t, b.stateDir)
}

// waitGuestAnswers waits until the guest at url answers "hi" (httpGuest).
func waitGuestAnswers(t *testing.T, url string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "the guest answers at "+url, func() (bool, error) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body) == "hi", fmt.Errorf("%d %q", resp.StatusCode, body)
	})
}

// A guest that serves "hi" on its port named http.
const httpGuest = `Deno.serve({ hostname: "127.0.0.1", port: Number(Deno.env.get("SOCIALWEB_PORT_HTTP")) }, () => new Response("hi"));`

// A contract asking for a guest port: the winner forwards it, says where in its vm.onNetwork
// event, and status.guest carries the address and the binding; the guest answers there.
func TestACC_MarketGuestPorts(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	newContract(t, env, "web", func(c *v1alpha1.ComputeContract) {
		c.Spec.UserData = httpGuest
		c.Spec.Ports = []v1alpha1.ContractPort{{Name: "http", Port: 8080}}
	})
	waitContract(t, env, "web", v1alpha1.ComputeContractHeld)
	var g *v1alpha1.GuestStatus
	testenv.Eventually(t, 10*time.Second, "guest address and ports", func() (bool, error) {
		var c v1alpha1.ComputeContract
		if err := env.Client.Get(context.Background(), key("web"), &c); err != nil {
			return false, err
		}
		g = c.Status.Guest
		return g != nil && g.Address == "127.0.0.1" && len(g.Ports) == 1, fmt.Errorf("guest %+v", g)
	})
	p := g.Ports[0]
	if p.Name != "http" || p.GuestPort != 8080 || p.HostPort <= 0 {
		t.Fatalf("port %+v, want http 8080 on some host port", p)
	}
	url := fmt.Sprintf("http://%s:%d/", g.Address, p.HostPort)
	waitGuestAnswers(t, url, 10*time.Second)
	release(t, env, "web")
	waitContract(t, env, "web", v1alpha1.ComputeContractReleased)
	waitNoProcs(t, b.stateDir)
}
