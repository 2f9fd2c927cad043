package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/testenv"
)

// TestBench_MarketDeploy prints Requested-to-Held of 20 contracts, one after another, with a
// deno guest and one bidder (the window closes early once the bidder has bid, so the figure
// is the overhead beyond the window), and then the release of each. SOCIALWEB_BENCH=1 runs it.
func TestBench_MarketDeploy(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	env := marketEnv(t)
	b := startBidder(t, env, "bidder1.test", 5)
	const n = 20
	var held []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("bench-%02d", i)
		start := time.Now()
		newContract(t, env, name)
		var c v1alpha1.ComputeContract
		testenv.Eventually(t, 30*time.Second, name+" Held", func() (bool, error) {
			err := env.Client.Get(context.Background(), key(name), &c)
			return err == nil && c.Status.Phase == v1alpha1.ComputeContractHeld, err
		})
		held = append(held, time.Since(start))
		release(t, env, name)
		waitContract(t, env, name, v1alpha1.ComputeContractReleased)
	}
	waitNoProcs(t, b.stateDir)
	sort.Slice(held, func(i, j int) bool { return held[i] < held[j] })
	t.Logf("Requested to Held, deno guest, %d contracts: p50 %s, p99 %s, max %s (target p50 < 300ms)",
		n, held[n/2].Round(time.Millisecond), held[n*99/100].Round(time.Millisecond), held[n-1].Round(time.Millisecond))
}
