package gateway_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
)

// Authenticated listClusters with 8 clients, each call with its own token (a jti is used
// once). The tokens are minted before the clock starts, by the embedded PDS in-process, so
// the figure is the gateway's: verification (the issuer's key from the directory's cache,
// one signature check per call), the replay cache, one List from the core's API server, the
// JSON answer. SOCIALWEB_BENCH=1 runs it; it prints figures and asserts nothing timed.
func TestBenchListClusters(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	const clients, perClient = 8, 250
	f := setup(t)
	// The figure is the gateway's work per call, not its rate limit.
	f.gw = startGatewayCfg(t, f.env, func(c *gateway.Config) {
		c.RateLimit = gateway.RateLimit{PerIP: rate.Inf, PerDID: rate.Inf}
	})
	ctx := context.Background()
	for _, n := range []string{"a1", "a2", "a3"} {
		f.do(t, f.a, cluster.CreateClusterNSID, name{n}, nil)
	}
	tokens := make([][]string, clients)
	for c := range tokens {
		for range perClient {
			tok, err := f.env.PDS.ServiceAuth(ctx, f.a.did, f.gw.DID(), cluster.ListClustersNSID, 10*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			tokens[c] = append(tokens[c], tok)
		}
	}
	// Warm: the issuer's DID document is resolved once and cached.
	f.do(t, f.a, cluster.ListClustersNSID, nil, nil)

	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, tok := range tokens[c] {
				var out cluster.ListClustersOutput
				t0 := time.Now()
				if err := gateway.Call(ctx, f.gw.URL(), cluster.ListClustersNSID, tok, nil, &out); err != nil {
					errs <- err
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
				if len(out.Clusters) != 3 {
					errs <- fmt.Errorf("%d clusters", len(out.Clusters))
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(p float64) time.Duration { return all[int(p*float64(len(all)-1))] }
	t.Logf("listClusters, %d clients x %d calls, one token each, on %d CPUs: p50 %v, p99 %v, max %v; %.0f requests/s",
		clients, perClient, runtime.NumCPU(), q(0.50).Round(10*time.Microsecond), q(0.99).Round(10*time.Microsecond),
		all[len(all)-1].Round(10*time.Microsecond), float64(len(all))/elapsed.Seconds())
}
