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

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
		if waitAll(t, env, &v1alpha1.InfraList{}, 1, 30*time.Second, func(o client.Object) bool {
			inf := o.(*v1alpha1.Infra)
			return inf.Name == "web" && inf.Spec.Description == want && inSync(v1alpha1.RecordPulled)(inf)
		}) != 1 {
			t.Fatalf("edit %d not pulled after 30s", i)
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
	// A watch, not a polled list: listing 1,000 objects every few hundred ms costs the API
	// server more than the controllers being measured.
	synced := waitAll(t, env, &v1alpha1.InfraList{}, n, 5*time.Minute, func(o client.Object) bool {
		return inSync(v1alpha1.RecordInSync)(o.(*v1alpha1.Infra))
	})
	all := time.Since(start)
	runtime.GC()
	fmt.Printf("BENCH infra thousand n=%d created=%s all-in-sync=%s in-sync=%d rss=%s\n", n, created.Round(time.Millisecond), all.Round(time.Millisecond), synced, rss())
	idx := readIndex(t, env)
	fmt.Printf("BENCH infra thousand index-live=%d\n", len(idx.Live))
	printRequestCounts(t, env)
}

// waitAll watches the namespace's objects of list's kind until n of them meet cond (or
// timeout) and returns how many did. A watch, not a polled list: listing 1,000 objects every
// few ms costs the API server more than the controllers being measured.
func waitAll(t *testing.T, env *testenv.Env, list client.ObjectList, n int, timeout time.Duration, cond func(client.Object) bool) int {
	t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	items, err := apimeta.ExtractList(list)
	if err != nil {
		t.Fatal(err)
	}
	met := map[string]bool{}
	for _, it := range items {
		o := it.(client.Object)
		met[o.GetName()] = cond(o)
	}
	count := func() int {
		c := 0
		for _, ok := range met {
			if ok {
				c++
			}
		}
		return c
	}
	// From the list's version on, so no change between the two is missed.
	w, err := wc.Watch(ctx, list, &client.ListOptions{Namespace: ns, Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for count() < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return count()
			}
			if o, ok := ev.Object.(client.Object); ok {
				met[o.GetName()] = cond(o)
			}
		case <-ctx.Done():
			return count()
		}
	}
	return count()
}

// printRequestCounts prints the API server's request counts of the socialweb.computer
// resources by verb: where a benchmark's writes go.
func printRequestCounts(t *testing.T, env *testenv.Env) {
	t.Helper()
	rc, err := rest.RESTClientFor(restConfigFor(env))
	if err != nil {
		t.Fatal(err)
	}
	b, err := rc.Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "apiserver_request_total{") && strings.Contains(l, `group="socialweb.computer"`) {
			fmt.Println("BENCH requests", l)
		}
	}
}

func restConfigFor(env *testenv.Env) *rest.Config {
	cfg := rest.CopyConfig(env.Config)
	cfg.GroupVersion = &v1alpha1.GroupVersion
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(env.Client.Scheme()).WithoutConversion()
	return cfg
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
