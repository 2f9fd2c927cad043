package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/bench"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
)

var (
	crashCycles = flag.Int("crash-cycles", 100, "cycles of TestBench_CrashLoop")
	// A cycle the loop reported can be tried again by narrowing the moment of the kill.
	crashKillFrom = flag.Duration("crash-kill-from", 0, "TestBench_CrashLoop kills no earlier than this into a cycle")
	crashKillTo   = flag.Duration("crash-kill-to", 0, "TestBench_CrashLoop kills no later than this into a cycle (0: a cycle without a kill)")
)

// TestBench_CrashLoop: N cycles (-crash-cycles, default 100) of deploying an Infra with one
// deno contract and deleting it, with `up` killed (SIGKILL) at a random moment of each
// cycle and started again on the same data dir. Prints how many cycles lost their
// deployment (its contract ended before its release was asked), leaked a guest process
// (one still running once the Infra is gone), or got stuck (the outcome not reached within
// a minute of the restart), and the recovery time after each restart: from the restart to
// the outcome the interrupted step was heading for (Deployed, or gone). SOCIALWEB_BENCH=1
// runs it.
func TestBench_CrashLoop(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	if deno.DefaultBinary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	guests := filepath.Join(dir, "bidder", "guests")
	up := startUp(t, dir)
	c := coreClient(t, dir)
	ensureOwnerRepo(t, c)

	// phaseOf is where the Infra stands: "deployed", "gone", or "" on the way; lost says
	// its contract ended with no release asked (why is the contract's phase and Ready
	// condition).
	var why string
	phaseOf := func(c client.Client, name string) (string, bool) {
		var inf v1alpha1.Infra
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &inf)
		if apierrors.IsNotFound(err) {
			return "gone", false
		}
		if err != nil {
			return "", false
		}
		var cc v1alpha1.ComputeContract
		lost := false
		if c.Get(ctx, client.ObjectKey{Namespace: "default", Name: infra.ContractName(infra.KindInfra, name, "api")}, &cc) == nil {
			lost = inf.DeletionTimestamp == nil && cc.Spec.Release == nil &&
				(cc.Status.Phase == v1alpha1.ComputeContractFailed || cc.Status.Phase == v1alpha1.ComputeContractReleased)
			if lost {
				why = string(cc.Status.Phase)
				if rc := meta.FindStatusCondition(cc.Status.Conditions, "Ready"); rc != nil {
					why += " " + rc.Reason + ": " + rc.Message
				}
			}
		}
		if inf.Status.Phase == v1alpha1.InfraDeployed && inf.DeletionTimestamp == nil {
			return "deployed", lost
		}
		return "", lost
	}
	// until polls the Infra until it reaches want, or is lost, or timeout passes.
	until := func(c client.Client, name, want string, timeout time.Duration) (reached, lost bool) {
		end := time.Now().Add(timeout)
		for time.Now().Before(end) {
			got, l := phaseOf(c, name)
			if l {
				return false, true
			}
			if got == want {
				return true, false
			}
			time.Sleep(20 * time.Millisecond)
		}
		return false, false
	}

	// One cycle without a kill sets the range of the random moment.
	t0 := time.Now()
	if err := c.Create(ctx, chaosInfra("loop-warm")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := until(c, "loop-warm", "deployed", 90*time.Second); !ok {
		t.Fatal("the warm-up Infra was not deployed")
	}
	if err := c.Delete(ctx, chaosInfra("loop-warm")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := until(c, "loop-warm", "gone", 60*time.Second); !ok {
		t.Fatal("the warm-up Infra did not go")
	}
	cycle := time.Since(t0)
	from, to := *crashKillFrom, *crashKillTo
	if to <= 0 {
		to = cycle
	}
	if from >= to {
		t.Fatalf("-crash-kill-from %v is not before -crash-kill-to %v", from, to)
	}

	var lost, leaked, stuck int
	var recovery []time.Duration
	for i := 0; i < *crashCycles; i++ {
		name := fmt.Sprintf("loop%d", i)
		killAt := from + time.Duration(rand.Int64N(int64(to-from)))
		start := time.Now()
		if err := c.Create(ctx, chaosInfra(name)); err != nil {
			t.Fatal(err)
		}
		killed := make(chan string, 1) // the step it was killed in
		go func() {
			step := "deploy"
			if ok, _ := until(c, name, "deployed", killAt); ok {
				step = "release"
				_ = c.Delete(ctx, chaosInfra(name))
				until(c, name, "gone", killAt-time.Since(start))
			}
			_ = up.cmd.Process.Signal(syscall.SIGKILL)
			killed <- step
		}()
		step := <-killed
		<-up.done
		restart := time.Now()
		up = startUp(t, dir)
		upReady := time.Since(restart)
		c = coreClient(t, dir)
		// Where was it heading? A deployment not yet asked to go is to be Deployed, then
		// released; one whose deletion was asked is to be gone.
		want := "deployed"
		if step == "release" {
			want = "gone"
		}
		ok, l := until(c, name, want, time.Minute)
		switch {
		case l:
			lost++
			t.Logf("cycle %d: killed at %v (%s): the contract ended with no release asked: %s; %s", i, killAt, step, why, keepLog(t, dir, i))
		case !ok:
			stuck++
			t.Logf("cycle %d: killed at %v (%s): not %s within a minute of the restart; %s", i, killAt, step, want, keepLog(t, dir, i))
		default:
			took := time.Since(restart)
			recovery = append(recovery, took)
			t.Logf("cycle %d: killed at %v (%s): %s %v after the restart (up ready in %v)", i, killAt.Round(time.Millisecond), step, want,
				took.Round(time.Millisecond), upReady.Round(time.Millisecond))
		}
		if want == "deployed" {
			_ = c.Delete(ctx, chaosInfra(name))
			if ok, _ := until(c, name, "gone", time.Minute); !ok {
				stuck++
				t.Logf("cycle %d: not gone within a minute of its deletion", i)
				continue
			}
		}
		end := time.Now().Add(10 * time.Second)
		for len(substratetest.Procs(guests)) != 0 && time.Now().Before(end) {
			time.Sleep(50 * time.Millisecond)
		}
		if pids := substratetest.Procs(guests); len(pids) != 0 {
			leaked++
			t.Logf("cycle %d: guest processes %v left once the Infra is gone", i, pids)
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	}
	up.stop(t)
	fmt.Printf("crash loop: %d cycles, %d lost, %d leaked, %d stuck (cycle without a kill %v; kill at a uniform moment in [%v, %v))\n",
		*crashCycles, lost, leaked, stuck, cycle.Round(time.Millisecond), from, to.Round(time.Millisecond))
	fmt.Printf("recovery after restart (restart to Deployed or gone): p50 %v, p99 %v, of %d\n",
		bench.Median(recovery).Round(time.Millisecond), bench.Percentile(recovery, 99).Round(time.Millisecond), len(recovery))
}

// keepLog copies up's log (every run on the data dir so far) of a lost or stuck cycle where
// it outlives the run: $SOCIALWEB_TEST_ARTIFACTS/<row>/cycle-N.log, else the temporary
// directory. It says where, or why it could not.
func keepLog(t *testing.T, dataDir string, cycle int) string {
	b, err := os.ReadFile(filepath.Join(dataDir, "logs", "socialweb.log"))
	if err != nil {
		return "no log kept: " + err.Error()
	}
	dir := os.Getenv("SOCIALWEB_TEST_ARTIFACTS")
	if dir == "" {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, t.Name())
	path := filepath.Join(dir, fmt.Sprintf("cycle-%d.log", cycle))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "no log kept: " + err.Error()
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "no log kept: " + err.Error()
	}
	return "up's log in " + path
}
