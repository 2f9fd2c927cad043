package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/bench"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// TestBench_Containment prints what containment costs a deno guest through the market, both
// sides in one run: contracts alternate (in alternating order) between a bidder whose guests
// are jailed, as every bidder's are, and one whose guests run under deno's permission flags
// alone (deno.Config.Unjailed, the baseline). Each contract names its bidder, so its window
// closes once that bidder has bid. Timed from the contract's creation (Requested) to Held and
// to the guest's first line of output. The jail's init is the small socialweb-guest-jail
// beside $SOCIALWEB_TEST_BIN when there is one (what `hack/build.sh` gives a bidder), else
// this test binary. SOCIALWEB_BENCH=1 runs it.
func TestBench_Containment(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	if deno.DefaultBinary() == "" {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	ctx := context.Background()
	env := marketEnv(t)
	init, initName := "", "this test binary"
	if bin := os.Getenv("SOCIALWEB_TEST_BIN"); bin != "" {
		if init = jail.InitBeside(bin); init != "" {
			initName = init
		}
	}
	sides := []struct {
		name         string
		b            *runningBidder
		held, output []time.Duration
	}{
		{name: "jailed (init " + initName + ")", b: startBidderWith(t, env, "jailed.test", 5, deno.Config{Init: init})},
		{name: "unjailed (deno's flags alone)", b: startBidderWith(t, env, "unjailed.test", 5, deno.Config{Unjailed: true})},
	}
	const n = 20
	for i := range n {
		for k := range sides {
			s := &sides[(i+k)%len(sides)]
			name := fmt.Sprintf("c-%02d-%d", i, (i+k)%len(sides))
			t0 := time.Now()
			newContract(t, env, name, func(c *v1alpha1.ComputeContract) { c.Spec.BidderDids = []string{s.b.DID()} })
			var c v1alpha1.ComputeContract
			testenv.Eventually(t, 30*time.Second, name+" Held", func() (bool, error) {
				err := env.Client.Get(ctx, key(name), &c)
				if c.Status.Phase == v1alpha1.ComputeContractFailed {
					t.Fatalf("%s Failed: %s", name, c.Status.Message)
				}
				return err == nil && c.Status.Phase == v1alpha1.ComputeContractHeld, err
			})
			s.held = append(s.held, time.Since(t0))
			for {
				if out := firstOutput(ctx, s.b); out {
					break
				}
				if time.Since(t0) > 30*time.Second {
					t.Fatalf("%s: no output from its guest", name)
				}
				time.Sleep(time.Millisecond)
			}
			s.output = append(s.output, time.Since(t0))
			release(t, env, name)
			waitContract(t, env, name, v1alpha1.ComputeContractReleased)
			waitNoProcs(t, s.b.stateDir)
		}
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000) }
	for _, s := range sides {
		fmt.Printf("deno Requested -> Held, %s, %d contracts: p50 %s, p99 %s; -> first output p50 %s, p99 %s\n",
			s.name, n, ms(bench.Median(s.held)), ms(bench.Percentile(s.held, 99)), ms(bench.Median(s.output)), ms(bench.Percentile(s.output, 99)))
	}
	ratio := func(f func(int) []time.Duration) float64 {
		return float64(bench.Median(f(0))) / float64(bench.Median(f(1)))
	}
	fmt.Printf("containment's cost, jailed / unjailed p50: to Held %.2fx, to first output %.2fx (goal within 10%%: <= 1.10x; load %s)\n",
		ratio(func(i int) []time.Duration { return sides[i].held }), ratio(func(i int) []time.Duration { return sides[i].output }), bench.LoadAvg())
}

// firstOutput says whether b's one running guest has printed anything.
func firstOutput(ctx context.Context, b *runningBidder) bool {
	gs, err := b.sub.List(ctx)
	if err != nil {
		return false
	}
	for _, g := range gs {
		if !g.Phase.Ended() {
			if l, _ := b.sub.Logs(ctx, g.ID, 0); len(l) > 0 {
				return true
			}
		}
	}
	return false
}

// TestBench_NodeContainment prints what the namespace flavour's containment costs a pod on a
// new node, both sides in one run: a node's boot to its Node Ready, and then a pod created
// for it to Running. Contained nodes (their own mount and PID namespaces and root, their
// disk, cgroup limits; the pod with hostUsers: false, as up's clusters require) alternate
// with uncontained ones (node.Config.Uncontained, the pod in the host's user namespace:
// nodes as they ran before containment); median of 5 each. The pod is created once the
// node is Ready: one created before waits out the scheduler's backoff after its failed
// attempts, which depends on when it last tried, not on the node. The market's part (rfp,
// bids, accept) is the same for both and left out, so the ratio is containment's share at
// its largest. SOCIALWEB_BENCH=1 runs it.
func TestBench_NodeContainment(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	tc := joinableCluster(t, "nc", "unused", time.Hour)
	ctx := context.Background()
	sides := []struct {
		name                  string
		s                     *node.Substrate
		hostUser              bool
		ready, running, total []time.Duration
	}{{name: "contained"}, {name: "uncontained", hostUser: true}}
	for i := range sides {
		state := filepath.Join(t.TempDir(), "nodes")
		s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, ImageDir: tc.images,
			EgressDeny: testEgressDeny, EgressAllow: testEgressAllow, Uncontained: sides[i].hostUser})
		if err != nil {
			t.Fatal(err)
		}
		substratetest.Cleanup(t, s, state)
		sides[i].s = s
	}
	const runs = 5
	for i := range runs {
		for k := range sides {
			side := &sides[(i+k)%len(sides)]
			nodeName := fmt.Sprintf("%s-%d", side.name, i)
			bundle, err := tenant.MintNodeBundle(filepath.Join(tc.dir, "tenants"), tenant.Key{Namespace: "default", Name: "nc"}, nodeName, tc.cl.Status.Server, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			bootNode(t, side.s, nodeName, nodeName, bundle)
			testenv.Eventually(t, 90*time.Second, nodeName+": Ready", func() (bool, error) {
				if g, _ := side.s.Status(ctx, nodeName); g.Phase.Ended() {
					t.Fatalf("%s: node guest ended: %+v", nodeName, g)
				}
				out, err := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
				return out == "True", fmt.Errorf("%q %v", out, err)
			})
			t1 := time.Now()
			pod := strings.NewReplacer("name: hello", "name: "+nodeName,
				"spec:\n", fmt.Sprintf("spec:\n  hostUsers: %v\n  nodeSelector: {kubernetes.io/hostname: %s}\n", side.hostUser, nodeName),
				`command: ["/bin/sh", "-c", "echo hello from $(hostname); test -x /bin/busybox"]`, `command: ["sleep", "3600"]`).Replace(nodePod)
			tkubectl(t, tc.kc, pod, "apply", "-f", "-")
			testenv.Eventually(t, 90*time.Second, nodeName+": pod Running", func() (bool, error) {
				out, err := tkubectlErr(tc.kc, "get", "pod", nodeName, "-o", "jsonpath={.status.phase}")
				return out == "Running", fmt.Errorf("%q %v", out, err)
			})
			t2 := time.Now()
			side.ready, side.running, side.total = append(side.ready, t1.Sub(t0)), append(side.running, t2.Sub(t1)), append(side.total, t2.Sub(t0))
			t.Logf("%s: boot -> Ready %.2fs, pod -> Running %.2fs", nodeName, t1.Sub(t0).Seconds(), t2.Sub(t1).Seconds())
			tkubectl(t, tc.kc, "", "delete", "pod", nodeName, "--wait=false")
			if err := side.s.Stop(ctx, nodeName); err != nil {
				t.Fatal(err)
			}
			if err := side.s.Remove(ctx, nodeName); err != nil {
				t.Fatal(err)
			}
			tkubectl(t, tc.kc, "", "delete", "node", nodeName, "--wait=false")
		}
	}
	for _, s := range sides {
		fmt.Printf("new node, %s, %d nodes, p50: boot -> Ready %.2fs, pod -> Running %.2fs, together %.2fs\n", s.name, runs,
			bench.Median(s.ready).Seconds(), bench.Median(s.running).Seconds(), bench.Median(s.total).Seconds())
	}
	ratio := func(f func(int) []time.Duration) float64 {
		return float64(bench.Median(f(0))) / float64(bench.Median(f(1)))
	}
	fmt.Printf("node containment's cost, contained / uncontained p50: boot -> Ready %.2fx, pod -> Running %.2fx, together %.2fx (goal within 10%%: <= 1.10x; load %s)\n",
		ratio(func(i int) []time.Duration { return sides[i].ready }), ratio(func(i int) []time.Duration { return sides[i].running }),
		ratio(func(i int) []time.Duration { return sides[i].total }), bench.LoadAvg())
}
