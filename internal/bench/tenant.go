package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/tenant"
)

// TenantOptions size the tenant cluster benchmark.
type TenantOptions struct {
	// Binary is the socialweb binary to start (`up`); default: this executable.
	Binary   string
	Clusters int           // clusters created one after another (median reported)
	Idle     time.Duration // idle time before reading RSS
	// Wakes are the sleep-and-wake cycles of one cluster (spec.sleepAfter 10 s): the first
	// request's answer after each wake is timed.
	Wakes    int
	Progress func(format string, a ...any)
}

// Tenant prints the tenant-cluster figures: Cluster created -> Ready at zero nodes, a stopped
// cluster's controlPlaneUp -> Ready, the idle RSS of one tenant control plane and how many
// fit in 8 GiB. It runs a real `socialweb up` (as root: the advertise address's network
// namespace) on a temporary data dir.
func Tenant(ctx context.Context, p Printer, o TenantOptions) error {
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		o.Binary = exe
	}
	say := o.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	tmp, err := os.MkdirTemp("", "socialweb-bench-tenant-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.Binary, err = ownCopy(o.Binary, tmp); err != nil {
		return err
	}
	dir := filepath.Join(tmp, "data")
	up, err := startUp(ctx, o.Binary, dir)
	if err != nil {
		return err
	}
	defer up.stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return err
	}
	// No client-side rate limit: client-go's default (5 requests a second once a burst of
	// 10 is spent) spaced the polls below 200 ms apart and rounded every figure up to it.
	cfg.QPS = -1
	c, err := client.New(cfg, client.Options{Scheme: ctrlmanager.Scheme()})
	if err != nil {
		return err
	}
	waitPhase := func(key client.ObjectKey, phase v1alpha1.ClusterPhase) (*v1alpha1.Cluster, error) {
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			var got v1alpha1.Cluster
			if err := c.Get(ctx, key, &got); err == nil && got.Status.Phase == phase && got.Status.ObservedGeneration == got.Generation {
				return &got, nil
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		return nil, fmt.Errorf("cluster %s not %s within 2m (see %s)", key, phase, filepath.Join(dir, "tenants", key.Namespace, key.Name, "controlplane.log"))
	}

	var create, upAgain, createCPU, upCPU []time.Duration
	var pids []int
	for i := 0; i < o.Clusters; i++ {
		name := fmt.Sprintf("bench%d", i)
		say("cluster %s: create -> Ready", name)
		cl := &v1alpha1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec:       v1alpha1.ClusterSpec{Account: "did:plc:benchowner", Name: name, Running: true},
		}
		t0 := time.Now()
		if err := c.Create(ctx, cl); err != nil {
			return err
		}
		got, err := waitPhase(client.ObjectKeyFromObject(cl), v1alpha1.ClusterReady)
		if err != nil {
			return err
		}
		create = append(create, time.Since(t0))
		pids = append(pids, instancePID(got.Status.Instance))
		createCPU = append(createCPU, cpuTime(instancePID(got.Status.Instance)))
		if i == 0 {
			// Alone, the control plane's RSS is its own: with others running, each also
			// counts the binary's code pages they all map (PSS splits those).
			say("idle for %s with one cluster", o.Idle)
			time.Sleep(o.Idle)
			r, err := rssMiB(pids[0])
			if err != nil {
				return err
			}
			p.Line(fmt.Sprintf("idle RSS of one tenant control plane, running alone (+%s)", o.Idle),
				fmt.Sprintf("%.0f MiB; anon %.0f MiB, PSS %.0f MiB", r, statusMiB(pids[0], "RssAnon:"), pssMiB(pids[0])), "< 250 MiB")
		}
	}
	p.Line(fmt.Sprintf("Cluster created -> Ready, zero nodes (median of %d)", o.Clusters), fmt.Sprintf("%.2f s (min %.2f, max %.2f; load %s)", Median(create).Seconds(), minD(create).Seconds(), maxD(create).Seconds(), LoadAvg()), "< 2 s")
	p.Line("  CPU time of the control plane until Ready (median)", fmt.Sprintf("%.2f s", Median(createCPU).Seconds()), "")

	say("idle for %s with %d clusters", o.Idle, o.Clusters)
	time.Sleep(o.Idle)
	var rss, pss []float64
	for _, pid := range pids {
		r, err := rssMiB(pid)
		if err != nil {
			return err
		}
		rss = append(rss, r)
		pss = append(pss, pssMiB(pid))
	}
	sort.Float64s(rss)
	sort.Float64s(pss)
	medRSS := rss[len(rss)/2]
	var anon []float64
	for _, pid := range pids {
		anon = append(anon, statusMiB(pid, "RssAnon:"))
	}
	sort.Float64s(anon)
	cpu0 := make([]time.Duration, len(pids))
	for i, pid := range pids {
		cpu0[i] = cpuTime(pid)
	}
	time.Sleep(10 * time.Second)
	var idleCPU []float64
	for i, pid := range pids {
		idleCPU = append(idleCPU, float64(cpuTime(pid)-cpu0[i])/float64(10*time.Second)*100)
	}
	sort.Float64s(idleCPU)
	medPSS, medAnon := pss[len(pss)/2], anon[len(anon)/2]
	p.Line(fmt.Sprintf("idle RSS of each of %d tenant control planes (+%s, median)", len(rss), o.Idle), fmt.Sprintf("%.0f MiB (min %.0f, max %.0f); anon %.0f MiB, PSS %.0f MiB", medRSS, rss[0], rss[len(rss)-1], medAnon, medPSS), "")
	p.Line("idle CPU of one tenant control plane (median)", fmt.Sprintf("%.1f%% of a core", idleCPU[len(idleCPU)/2]), "")
	p.Line("idle tenant control planes in 8 GiB", fmt.Sprintf("%d by RSS, %d by PSS", int(8192/medRSS), int(8192/medPSS)), "")

	for i := 0; i < o.Clusters; i++ {
		key := client.ObjectKey{Namespace: "default", Name: fmt.Sprintf("bench%d", i)}
		say("cluster %s: controlPlaneDown, controlPlaneUp -> Ready", key.Name)
		if err := c.Patch(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
			client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"running":false}}`))); err != nil {
			return err
		}
		if _, err := waitPhase(key, v1alpha1.ClusterUnavailable); err != nil {
			return err
		}
		t0 := time.Now()
		if err := c.Patch(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}},
			client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"running":true}}`))); err != nil {
			return err
		}
		if _, err := waitPhase(key, v1alpha1.ClusterReady); err != nil {
			return err
		}
		upAgain = append(upAgain, time.Since(t0))
		var got v1alpha1.Cluster
		if err := c.Get(ctx, key, &got); err == nil {
			upCPU = append(upCPU, cpuTime(instancePID(got.Status.Instance)))
		}
	}
	p.Line(fmt.Sprintf("controlPlaneUp of a stopped cluster -> Ready (median of %d)", o.Clusters), fmt.Sprintf("%.2f s (min %.2f, max %.2f; load %s)", Median(upAgain).Seconds(), minD(upAgain).Seconds(), maxD(upAgain).Seconds(), LoadAvg()), "< 1.5 s")
	if len(upCPU) > 0 {
		p.Line("  CPU time of the control plane until Ready (median)", fmt.Sprintf("%.2f s", Median(upCPU).Seconds()), "")
	}

	if o.Wakes > 0 {
		if err := benchWake(ctx, p, c, dir, client.ObjectKey{Namespace: "default", Name: "bench0"}, o.Wakes, waitPhase, say); err != nil {
			return err
		}
	}

	say("deleting the clusters")
	var del []time.Duration
	for i := 0; i < o.Clusters; i++ {
		key := client.ObjectKey{Namespace: "default", Name: fmt.Sprintf("bench%d", i)}
		t0 := time.Now()
		if err := c.Delete(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
			return err
		}
		for {
			if err := c.Get(ctx, key, &v1alpha1.Cluster{}); client.IgnoreNotFound(err) == nil && err != nil {
				break
			}
			if time.Since(t0) > 2*time.Minute {
				return fmt.Errorf("cluster %s not gone within 2m", key)
			}
			time.Sleep(5 * time.Millisecond)
		}
		del = append(del, time.Since(t0))
	}
	p.Line(fmt.Sprintf("Cluster deleted -> gone, store removed (median of %d)", o.Clusters), fmt.Sprintf("%.2f s", Median(del).Seconds()), "")
	return up.stop()
}

// benchWake lets one cluster fall asleep (sleepAfter 10 s) and wakes it with a list of
// configmaps through its gate, n times: the figures are that request's time to its answer
// and what the control plane holds in memory while asleep.
func benchWake(ctx context.Context, p Printer, c client.Client, dir string, key client.ObjectKey, n int,
	waitPhase func(client.ObjectKey, v1alpha1.ClusterPhase) (*v1alpha1.Cluster, error), say func(string, ...any)) error {
	var cl v1alpha1.Cluster
	if err := c.Get(ctx, key, &cl); err != nil {
		return err
	}
	pki := tenant.PKI{Dir: tenant.LayoutFor(filepath.Join(dir, "tenants"), key.Namespace, key.Name).PKI()}
	tlsConfig, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: pki.Cert("ca"), CertFile: pki.Cert("admin"), KeyFile: pki.Key("admin")}})
	if err != nil {
		return err
	}
	// A connection of its own per request, closed after it, as each kubectl run's is: an
	// idle connection kept in a pool is a client the gate counts, and keeps the cluster
	// awake until the pool drops it.
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true}}
	list := func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cl.Status.Server+"/api/v1/namespaces/default/configmaps", nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("list configmaps: %s", resp.Status)
		}
		return nil
	}
	if err := c.Patch(ctx, &cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"sleepAfter":"10s"}}`))); err != nil {
		return err
	}
	var wake []time.Duration
	var asleepRSS float64
	left := 0
	for i := range n {
		say("cluster %s: sleep and wake %d of %d", key.Name, i+1, n)
		awake, err := waitPhase(key, v1alpha1.ClusterReady)
		if err != nil {
			return err
		}
		pid := instancePID(awake.Status.Instance)
		if _, err := waitPhase(key, v1alpha1.ClusterSleeping); err != nil {
			return err
		}
		// Whatever of the control plane is left: its process, were it still there.
		if r, err := rssMiB(pid); err == nil && pidAlive(pid) {
			asleepRSS, left = max(asleepRSS, r), left+1
		}
		t0 := time.Now()
		if err := list(); err != nil {
			return fmt.Errorf("the request that wakes %s: %w", key, err)
		}
		wake = append(wake, time.Since(t0))
	}
	if err := c.Patch(ctx, &cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"sleepAfter":null}}`))); err != nil {
		return err
	}
	p.Line(fmt.Sprintf("wake from sleep -> first answer (kubectl-like list through the gate, %d wakes)", n),
		fmt.Sprintf("median %.2f s, p99 %.2f s (min %.2f; load %s)", Median(wake).Seconds(), Percentile(wake, 99).Seconds(), minD(wake).Seconds(), LoadAvg()), "< 1.5 s")
	p.Line("RSS of a sleeping cluster's control plane (most over the sleeps)", fmt.Sprintf("%.0f MiB (its process left in %d of %d sleeps)", asleepRSS, left, n), "0")
	return nil
}

// pidAlive: the process exists and is not a zombie.
func pidAlive(pid int) bool {
	st, err := guestproc.ReadStat(pid)
	return err == nil && st.State != 'Z'
}

func instancePID(instance string) int {
	n, _ := strconv.Atoi(instance[strings.LastIndexByte(instance, '-')+1:])
	return n
}

func pssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Pss:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuTime is the user+system CPU time a process has used (0 when it cannot be read).
func cpuTime(pid int) time.Duration {
	st, err := guestproc.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.CPU
}

func statusMiB(pid int, field string) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field) {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func minD(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = min(m, d)
	}
	return m
}

func maxD(ds []time.Duration) time.Duration {
	m := ds[0]
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}
