package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/infra"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/logsink"
)

// CoreOptions size the core benchmark.
type CoreOptions struct {
	// Binary is the socialweb binary to start (`up`); default: this executable.
	Binary  string
	Starts  int // up-to-ready runs (median reported)
	Creates int // sequential Infra creates
	Latency int // objects for create-to-reconcile latency
	Idle    time.Duration
	// Progress receives a line per phase.
	Progress func(format string, a ...any)
}

// Core prints the four figures of the core: up to ready, idle RSS, sequential creates,
// and create-to-reconcile latency.
func Core(ctx context.Context, p Printer, o CoreOptions) (err error) {
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
	tmp, err := os.MkdirTemp("", "socialweb-bench-up-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if o.Binary, err = ownCopy(o.Binary, tmp); err != nil {
		return err
	}

	// 1. up to ready, on a fresh data dir and on a restart of the same one.
	var fresh, again []time.Duration
	for i := 0; i < o.Starts; i++ {
		say("up to ready: run %d/%d", i+1, o.Starts)
		dir := filepath.Join(tmp, fmt.Sprintf("run%d", i))
		for _, into := range []*[]time.Duration{&fresh, &again} {
			up, err := startUp(ctx, o.Binary, dir)
			if err != nil {
				return err
			}
			*into = append(*into, up.ready)
			if err := up.stop(); err != nil {
				return err
			}
		}
	}
	p.Line(fmt.Sprintf("up to ready, restart of a data dir (median of %d)", o.Starts), fmt.Sprintf("%.2f s", Median(again).Seconds()), "< 1 s")
	p.Line(fmt.Sprintf("up to ready, fresh data dir (median of %d)", o.Starts), fmt.Sprintf("%.2f s", Median(fresh).Seconds()), "")

	// 2. idle RSS, 3. sequential creates: against a running `up`.
	dir := filepath.Join(tmp, "run0")
	up, err := startUp(ctx, o.Binary, dir)
	if err != nil {
		return err
	}
	defer up.stop()
	say("idle for %s", o.Idle)
	time.Sleep(o.Idle)
	// RssFile is the binary's own pages (shared with every tenant control plane, which runs
	// the same executable); RssAnon is the heap, stacks and runtime of this process alone.
	m, err := procStatus(up.cmd.Process.Pid, "VmRSS", "RssAnon", "RssFile")
	if err != nil {
		return err
	}
	p.Line(fmt.Sprintf("idle RSS of up after ready (+%s)", o.Idle), fmt.Sprintf("%.0f MiB (anon %.0f, file %.0f)", m["VmRSS"], m["RssAnon"], m["RssFile"]), "< 150 MiB")

	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, 1000
	c, err := client.New(cfg, client.Options{Scheme: ctrlmanager.Scheme()})
	if err != nil {
		return err
	}
	say("creating %d Infras one after another", o.Creates)
	rate, err := sequentialCreates(ctx, c, "seq", o.Creates)
	if err != nil {
		return err
	}
	p.Line(fmt.Sprintf("sequential Infra creates (%d, unthrottled)", o.Creates), rate, ">= 500/s")
	if err := up.stop(); err != nil {
		return err
	}

	// The in-process cores log to a buffer, shown only when a step fails: their shutdown cuts
	// short requests in flight, which the figures do not need to hear about.
	var inProcessLog logsink.Buffer
	defer func() {
		if err != nil {
			fmt.Fprint(os.Stderr, inProcessLog.String())
		}
	}()

	// 3b. The same loop against the API server alone: no controller writes a status for each
	// new Infra on the same two cores, which tells the API server's share from theirs.
	say("creating %d Infras one after another, API server alone", o.Creates)
	if err := alone(ctx, p, o.Creates, &inProcessLog); err != nil {
		return err
	}

	// 4. create-to-reconcile, in-process so the reconcile start is observed exactly.
	say("create-to-reconcile latency over %d objects", o.Latency)
	return createToReconcile(ctx, p, o.Latency, &inProcessLog)
}

// alone is figure 3b: sequential creates against an in-process API server with no
// controllers, what each cost, and the host's reference figures.
func alone(ctx context.Context, p Printer, creates int, log io.Writer) error {
	env, err := startInProcess(ctx, log, nil)
	if err != nil {
		return err
	}
	defer env.stop()
	before, err := costNow()
	if err != nil {
		return err
	}
	rate, err := sequentialCreates(ctx, env.client, "alone", creates)
	if err != nil {
		return err
	}
	after, err := costNow()
	if err != nil {
		return err
	}
	p.Line(fmt.Sprintf("sequential Infra creates (%d), API server alone, in-process client", creates), rate, "")
	p.Line("  what each of those creates cost", before.per(after, creates), "")
	host, err := hostReference(env.tmp)
	if err != nil {
		return err
	}
	p.Line("  this host", host, "")
	return nil
}

// createToReconcile is figure 4: from each create to the start of its reconcile by the Infra
// controller, observed in-process.
func createToReconcile(ctx context.Context, p Printer, objects int, log io.Writer) error {
	reconciles := make(chan reconcileStart, 100000)
	env, err := startInProcess(ctx, log, reconciles)
	if err != nil {
		return err
	}
	defer env.stop()
	seen := make([]time.Duration, 0, objects)
	for i := 0; i < objects; i++ {
		inf := benchInfra("lat", i)
		at := time.Now()
		if err := env.client.Create(ctx, inf); err != nil {
			return err
		}
		deadline := time.After(10 * time.Second)
	wait:
		for {
			select {
			case r := <-reconciles:
				if r.Controller == infra.ControllerName && r.Request.Name == inf.Name {
					seen = append(seen, r.At.Sub(at))
					break wait
				}
			case <-deadline:
				return fmt.Errorf("no reconcile of %s within 10s", inf.Name)
			}
		}
	}
	p.Line(fmt.Sprintf("create-to-reconcile, Infra controller (%d objects)", objects), fmt.Sprintf("p50 %s, p99 %s", ms(Median(seen)), ms(Percentile(seen, 99))), "p99 < 50 ms")
	return nil
}

// sequentialCreates creates n Infras one after another and says how fast: objects/s, p50, p99.
func sequentialCreates(ctx context.Context, c client.Client, prefix string, n int) (string, error) {
	lat := make([]time.Duration, 0, n)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		inf := benchInfra(prefix, i)
		s := time.Now()
		if err := c.Create(ctx, inf); err != nil {
			return "", fmt.Errorf("create %d: %w", i, err)
		}
		lat = append(lat, time.Since(s))
	}
	wall := time.Since(t0)
	return fmt.Sprintf("%.0f objects/s, p50 %s, p99 %s", float64(n)/wall.Seconds(), ms(Median(lat)), ms(Percentile(lat, 99))), nil
}

func benchInfra(prefix string, i int) *v1alpha1.Infra {
	return &v1alpha1.Infra{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%05d", prefix, i), Namespace: "bench"},
		Spec: v1alpha1.InfraSpec{Description: "benchmark", Contracts: []v1alpha1.InfraContract{
			{Name: "a"}, {Name: "b", ComputeKind: v1alpha1.ComputeKindDeno}, {Name: "c"},
		}},
	}
}

type upProcess struct {
	cmd   *exec.Cmd
	ready time.Duration
	done  chan error
}

// startUp runs `socialweb up` and returns once it prints its ready line.
func startUp(ctx context.Context, bin, dir string) (*upProcess, error) {
	cmd := exec.CommandContext(ctx, bin, "up", "--data-dir", dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	u := &upProcess{cmd: cmd, done: make(chan error, 1)}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		u.done <- cmd.Wait()
	}()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return nil, fmt.Errorf("socialweb up exited before ready (see %s/logs)", dir)
			}
			if strings.Contains(l, "is ready") {
				u.ready = time.Since(t0)
				go func() {
					for range lines {
					}
				}()
				return u, nil
			}
		case <-timeout:
			cmd.Process.Kill()
			return nil, fmt.Errorf("socialweb up not ready after 60s")
		}
	}
}

func (u *upProcess) stop() error {
	if u.cmd.ProcessState != nil {
		return nil
	}
	_ = u.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-u.done:
		if err != nil {
			return fmt.Errorf("socialweb up exited with %v on SIGINT", err)
		}
	case <-time.After(30 * time.Second):
		u.cmd.Process.Kill()
		return fmt.Errorf("socialweb up did not stop within 30s of SIGINT")
	}
	return nil
}

func rssMiB(pid int) (float64, error) {
	m, err := procStatus(pid, "VmRSS")
	return m["VmRSS"], err
}

// procStatus reads the named kB fields of /proc/PID/status, in MiB.
func procStatus(pid int, fields ...string) (map[string]float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !slices.Contains(fields, strings.TrimSuffix(f[0], ":")) {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, err
		}
		out[strings.TrimSuffix(f[0], ":")] = kb / 1024
	}
	for _, name := range fields {
		if _, ok := out[name]; !ok {
			return nil, fmt.Errorf("no %s for pid %d", name, pid)
		}
	}
	return out, nil
}

// ownCopy copies the binary into dir and returns the copy's path, for `up` to run from.
// Once ready, up (and each tenant control plane it runs) pages out the start-up pages of its
// executable, and the kernel keeps any page another process also maps: run from the same
// file as this benchmark process, up's pages would stay resident because this process maps
// them too, and their RSS would count what `up` alone does not keep.
func ownCopy(binary, dir string) (string, error) {
	own := filepath.Join(dir, "socialweb")
	return own, copyFile(binary, own, 0o755)
}

func copyFile(from, to string, mode os.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
