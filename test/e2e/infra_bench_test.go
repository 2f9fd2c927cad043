package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/testenv"
)

// Benchmarks print figures and assert nothing; run with
// SOCIALWEB_BENCH=1 go test ./test/e2e -run TestBenchInfra -v -timeout 30m.

func benchOnly(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") != "1" {
		t.Skip("set SOCIALWEB_BENCH=1 to run")
	}
}

// PDS edit -> object Pulled and Synced: putRecord straight to the PDS, then time until the
// object holds the edit with Synced True and direction Pulled.
func TestBenchInfra_PDSEditToPulled(t *testing.T) {
	benchOnly(t)
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	localRepo(t, env, "me")
	newInfra(t, env, "web", "v0", []string{"api", "db", "cache"})
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	const n = 100
	var lat []time.Duration
	for i := 1; i <= n; i++ {
		rec, _ := pdsInfra(t, env, "web")
		want := fmt.Sprintf("v%d", i)
		rec.Description = &want
		start := time.Now()
		putInfra(t, env, "web", *rec)
		for {
			var inf v1alpha1.Infra
			if err := env.Client.Get(context.Background(), key("web"), &inf); err == nil && inf.Spec.Description == want && inSync(v1alpha1.RecordPulled)(&inf) {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("edit %d not pulled after 30s", i)
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	fmt.Printf("BENCH infra pds-edit-to-pulled n=%d p50=%s p99=%s max=%s\n", n, lat[n/2].Round(time.Millisecond), lat[n*99/100-1].Round(time.Millisecond), lat[n-1].Round(time.Millisecond))
}

// 1,000 Infras with 3 staged contracts each, bound to one repo: time until all are InSync,
// and the process RSS at the end (the core, the PDS and the controllers share the process).
func TestBenchInfra_ThousandInSync(t *testing.T) {
	benchOnly(t)
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	const n = 1000
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("d%04d", i), Namespace: ns},
					Spec: v1alpha1.InfraSpec{Description: "bench", Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}},
						Contracts: []v1alpha1.InfraContract{{Name: "a"}, {Name: "b"}, {Name: "c"}}}}
				if err := env.Client.Create(ctx, inf); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	created := time.Since(start)
	synced := 0
	for {
		var list v1alpha1.InfraList
		if err := env.Client.List(ctx, &list); err != nil {
			t.Fatal(err)
		}
		synced = 0
		for i := range list.Items {
			if inSync(v1alpha1.RecordInSync)(&list.Items[i]) {
				synced++
			}
		}
		if synced == n || time.Since(start) > 5*time.Minute {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	all := time.Since(start)
	runtime.GC()
	fmt.Printf("BENCH infra thousand n=%d created=%s all-in-sync=%s in-sync=%d rss=%s\n", n, created.Round(time.Millisecond), all.Round(time.Millisecond), synced, rss())
	idx := readIndex(t, env)
	fmt.Printf("BENCH infra thousand index-live=%d\n", len(idx.Live))
}

func rss() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return "?"
}
