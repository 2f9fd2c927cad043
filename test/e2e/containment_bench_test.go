package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/bench"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/substratetest"
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
		ratio(func(i int) []time.Duration { return sides[i].held }), ratio(func(i int) []time.Duration { return sides[i].output }), loadAvg())
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
