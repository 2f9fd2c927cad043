// Command conformance runs the upstream Kubernetes conformance suite against a tenant cluster
// of `socialweb up` (hack/conformance.sh; docs/conformance.md says what it does and the
// latest figures). It builds e2e.test and the conformance images from the module's
// k8s.io/kubernetes, serves the images from a registry in a network namespace standing for
// the internet, starts up with a fresh data dir, creates a Cluster and runs the suite.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type options struct {
	focus, skip    string
	noDefaultSkips bool
	procs          int
	maxNodes       int
	podsPerNode    int
	images         string // registry, preload or both
	keep           bool
	timeout        time.Duration
	binary         string
	dryRun         bool
	report         string
}

func main() {
	var o options
	flag.StringVar(&o.focus, "focus", `\[Conformance\]`, "ginkgo focus: a regular expression on the specs' full text")
	flag.StringVar(&o.skip, "skip", "", "ginkgo skip, added to the default skips (docs/conformance.md lists them)")
	flag.BoolVar(&o.noDefaultSkips, "no-default-skips", false, "run the default skips too")
	flag.IntVar(&o.procs, "procs", 4, "parallel ginkgo processes ([Serial] specs are skipped by default; run them with --procs 1)")
	flag.IntVar(&o.maxNodes, "max-nodes", 3, "the Cluster's maxNodes")
	flag.IntVar(&o.podsPerNode, "pods-per-node", 40, "the Cluster's podsPerNode")
	flag.StringVar(&o.images, "images", "both", "how nodes get the images: registry (pulled from the registry in the internet namespace), preload (tarballs in the node bidder's images dir), both")
	flag.BoolVar(&o.keep, "keep", false, "leave up, the cluster and the registry running after the suite (Ctrl-C ends them)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Hour, "the suite's timeout")
	flag.StringVar(&o.binary, "binary", "bin/socialweb", "the socialweb binary (hack/build.sh)")
	flag.BoolVar(&o.dryRun, "dry-run", false, "list the specs the focus and skips select, and stop")
	flag.StringVar(&o.report, "report", "", "print the figures of a JUnit report of an earlier run (e.g. .cache/conformance/junit.xml) and stop")
	flag.Parse()
	if o.report != "" {
		b, err := os.ReadFile(o.report)
		if err == nil {
			err = printSummary(b, o.report, 0)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "conformance:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("conformance %s: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// cacheDir holds everything the harness builds and the run's state (gitignored).
const cacheDir = ".cache/conformance"

func run(o options) error {
	if o.images != "registry" && o.images != "preload" && o.images != "both" {
		return fmt.Errorf("--images %q: want registry, preload or both", o.images)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	t0 := time.Now()
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("another conformance run holds %s (its namespace and registry address are fixed)", lock.Name())
	}
	// Closed at the end, not before: an unreachable *os.File is closed by its finalizer, and
	// the lock would go with it in the middle of a run.
	defer lock.Close()

	tl, err := buildTools(ctx)
	if err != nil {
		return err
	}
	e2eTest, ginkgo := tl.e2eTest, tl.ginkgo
	skips := defaultSkips
	if o.noDefaultSkips {
		skips = nil
	}
	skip := skipRegex(skips, o.skip)
	selected, err := dryRun(ctx, e2eTest, o.focus, skip, o.dryRun)
	if err != nil {
		return err
	}
	say("%d specs selected by focus %q and %d skip patterns", selected, o.focus, len(skips))
	if o.dryRun {
		return nil
	}

	abs, _ := filepath.Abs(cacheDir)
	runDir := filepath.Join(abs, "run")
	if err := cleanRunDir(runDir); err != nil {
		return err
	}

	// Images: built, served, remapped.
	if tl.busybox, err = buildBusybox(ctx, abs); err != nil {
		return err
	}
	t := time.Now()
	imgs, err := buildImages(tl, filepath.Join(moduleDir(ctx, "k8s.io/kubernetes"), "test", "images", "agnhost"))
	if err != nil {
		return err
	}
	refs, err := imageRefs(registryAddr, imgs)
	if err != nil {
		return err
	}
	if err := makeInternet(); err != nil {
		return fmt.Errorf("internet namespace: %w", err)
	}
	defer func() {
		if !o.keep {
			removeInternet()
		}
	}()
	srv, err := serveRegistry()
	if err != nil {
		return err
	}
	defer srv.Close()
	if err := push(ctx, refs); err != nil {
		return err
	}
	say("%d image references built and pushed to %s in %s", len(refs), registryAddr, since(t))
	repoListFile := filepath.Join(runDir, "repo-list.yaml")
	if err := os.WriteFile(repoListFile, []byte(repoList(registryAddr)), 0o644); err != nil {
		return err
	}
	regDir := filepath.Join(runDir, "registries")
	if err := os.MkdirAll(filepath.Join(regDir, registryAddr), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(regDir, registryAddr, "hosts.toml"), []byte(hostsTOML(registryAddr)), 0o644); err != nil {
		return err
	}
	dataDir := filepath.Join(runDir, "data")

	// up, the Cluster, a node kept rented.
	up, err := startUp(ctx, o.binary, dataDir, regDir)
	if err != nil {
		return err
	}
	defer func() {
		if o.keep {
			say("--keep: up runs (data dir %s); Ctrl-C ends it", dataDir)
			<-ctx.Done()
		}
		up.stop(dataDir)
	}()
	// After up made its data dir (it refuses one it did not make), before the first node.
	if o.images != "registry" {
		t := time.Now()
		if err := preload(filepath.Join(dataDir, "node-bidder", "images", "conformance.tar"), refs); err != nil {
			return err
		}
		say("images written to the node bidder's images dir in %s (nodes import them at boot)", since(t))
	}
	kc, err := makeCluster(ctx, o, up, dataDir, refs)
	if err != nil {
		return err
	}

	// The suite.
	ts := time.Now()
	report := filepath.Join(abs, "junit.xml")
	_ = os.Remove(report)
	runErr := runSuite(ctx, o, ginkgo, e2eTest, kc, repoListFile, skip, selected, abs)
	b, err := os.ReadFile(report)
	if err != nil {
		return errors.Join(runErr, fmt.Errorf("no junit report: %w", err))
	}
	if err := printSummary(b, report, selected); err != nil {
		return err
	}
	fmt.Printf("wall time %s (suite %s)\n", since(t0), since(ts))
	return runErr
}

// printSummary prints a FAILED line per failed spec, a SKIPPED line per spec that skipped
// itself, and the figures.
// selected, when known, is how many specs the run selected: those with no outcome in the
// report never started (the suite's timeout, or an abort).
func printSummary(report []byte, path string, selected int) error {
	s, err := summarize(report)
	if err != nil {
		return err
	}
	if s.Interrupted > 0 {
		defer fmt.Printf("%d specs were cut short by the suite's --timeout or an abort (no verdict)\n", s.Interrupted)
	}
	if n := selected - s.Passed - s.Failed - s.Skipped - s.Interrupted; selected > 0 && n > 0 {
		defer fmt.Printf("%d of the %d selected specs did not run (the suite's --timeout, or an abort)\n", n, selected)
	}
	for _, f := range s.Failures {
		fmt.Printf("FAILED %s (%.0fs): %s\n", f.Name, f.Seconds, f.Message)
	}
	for _, sk := range s.Skips {
		fmt.Printf("SKIPPED %s: %s\n", sk.Name, sk.Message)
	}
	fmt.Printf("%d passed, %d failed, %d skipped (junit %s)\n", s.Passed, s.Failed, s.Skipped, path)
	return nil
}

// keepNodes is how many nodes the run keeps rented from its start (two: see keep-nodes).
const keepNodes = 2

func since(t time.Time) string { return time.Since(t).Round(time.Second).String() }

// tools are the binaries the harness builds: the suite, its runner, and what the images
// hold.
type tools struct {
	e2eTest, ginkgo, agnhost string
	// sampleAPIServer and etcd are the Aggregator spec's (k8s.io/sample-apiserver, and the
	// etcd server the project embeds, through etcdmain.go).
	sampleAPIServer, etcd string
	// nonewprivs prints its effective uid: setuid root in its image, for the
	// AllowPrivilegeEscalation spec.
	nonewprivs string
	// busybox is the userland's, upstream's built from source (busybox.go).
	busybox string
}

// buildTools builds (or finds cached) the tools from the module's k8s.io/kubernetes (and its
// etcd). They build against a copy of go.mod and go.sum in the cache, so the test
// dependencies they add never touch the project's own. A stamp of what they are made from
// says when to build them all again: the versions of k8s.io/kubernetes, k8s.io/sample-apiserver's
// counterpart (k8s.io/apiserver) and the etcd server in go.mod, the version ldflags and the Go
// toolchain. Another module's bump in go.mod does not rebuild the suite (15-25 minutes
// here): the suite measured is k8s.io/kubernetes's. A tool missing is built alone.
func buildTools(ctx context.Context) (tools, error) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		return tools{}, fmt.Errorf("run from the repository's root: %w", err)
	}
	// e2e.test carries the Kubernetes version as the binary does: some specs read their own
	// version (a Pod Security level's "restricted/v1.37"), and without it they read v0.0.
	ldflags, err := exec.CommandContext(ctx, "bash", "hack/kube-ldflags.sh").Output()
	if err != nil {
		return tools{}, fmt.Errorf("hack/kube-ldflags.sh: %w", err)
	}
	h := sha256.New()
	h.Write(ldflags)
	h.Write([]byte(runtime.Version()))
	for _, l := range strings.Split(string(gomod), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && slices.Contains([]string{"k8s.io/kubernetes", "k8s.io/apiserver", "go.etcd.io/etcd/server/v3"}, f[0]) {
			h.Write([]byte(f[0] + " " + f[1] + "\n"))
		}
	}
	stamp := hex.EncodeToString(h.Sum(nil))
	abs, _ := filepath.Abs(cacheDir)
	t := tools{
		e2eTest: filepath.Join(abs, "e2e.test"), ginkgo: filepath.Join(abs, "ginkgo"), agnhost: filepath.Join(abs, "agnhost"),
		sampleAPIServer: filepath.Join(abs, "sample-apiserver"), etcd: filepath.Join(abs, "etcd"),
		nonewprivs: filepath.Join(abs, "nonewprivs"),
	}
	all := []string{t.e2eTest, t.ginkgo, t.agnhost, t.sampleAPIServer, t.etcd, t.nonewprivs}
	stampFile := filepath.Join(abs, "tools.stamp")
	old, _ := os.ReadFile(stampFile)
	current := strings.TrimSpace(string(old)) == stamp
	if current && allExist(all) {
		say("e2e.test, ginkgo and the images' binaries are current (the versions they are built from unchanged)")
		return t, nil
	}
	modfile := filepath.Join(abs, "go.mod")
	if err := os.WriteFile(modfile, gomod, 0o644); err != nil {
		return tools{}, err
	}
	gosum, err := os.ReadFile("go.sum")
	if err != nil {
		return tools{}, err
	}
	if err := os.WriteFile(filepath.Join(abs, "go.sum"), gosum, 0o644); err != nil {
		return tools{}, err
	}
	static := []string{"CGO_ENABLED=0"}
	for _, b := range []struct {
		what, out string
		args      []string
		env       []string
	}{
		// -vet=off: vet over the whole e2e tree takes far longer than the compile.
		{"e2e.test", t.e2eTest, []string{"test", "-vet=off", "-ldflags", strings.TrimSpace(string(ldflags)), "-c", "k8s.io/kubernetes/test/e2e"}, nil},
		{"ginkgo", t.ginkgo, []string{"build", "github.com/onsi/ginkgo/v2/ginkgo"}, nil},
		{"agnhost", t.agnhost, []string{"build", "k8s.io/kubernetes/test/images/agnhost"}, static},
		{"sample-apiserver", t.sampleAPIServer, []string{"build", "k8s.io/sample-apiserver"}, static},
		{"etcd", t.etcd, []string{"build", "hack/conformance/etcdmain.go"}, static},
		{"nonewprivs", t.nonewprivs, []string{"build", "k8s.io/kubernetes/test/images/nonewprivs"}, static},
	} {
		if current && exists(b.out) {
			continue
		}
		start := time.Now()
		say("building %s (minutes when cold)", b.what)
		args := append([]string{b.args[0], "-modfile=" + modfile, "-o", b.out}, b.args[1:]...)
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Env = append(append(os.Environ(), "GOFLAGS=-mod=mod"), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return tools{}, fmt.Errorf("build %s: %v\n%s", b.what, err, out)
		}
		say("built %s in %s", b.what, since(start))
	}
	return t, os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644)
}

func allExist(paths []string) bool {
	for _, p := range paths {
		if !exists(p) {
			return false
		}
	}
	return true
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// moduleDir is where the module cache holds mod (its source: agnhost's porter files).
func moduleDir(ctx context.Context, mod string) string {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", mod).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// dryRun counts the specs focus and skip select (and checks both are valid expressions).
func dryRun(ctx context.Context, e2eTest, focus, skip string, list bool) (int, error) {
	args := []string{"--ginkgo.dry-run", "--ginkgo.focus", focus, "--ginkgo.no-color"}
	if skip != "" {
		args = append(args, "--ginkgo.skip", skip)
	}
	if list {
		args = append(args, "--ginkgo.v")
	}
	out, err := exec.CommandContext(ctx, e2eTest, args...).CombinedOutput()
	if list {
		os.Stdout.Write(out)
	}
	ran, _, ok := ranOf(string(out))
	if !ok {
		return 0, fmt.Errorf("dry run: %v\n%s", err, tail(string(out), 30))
	}
	return ran, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cleanRunDir removes a previous run's state (its up is gone: the lock says so).
func cleanRunDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("previous run's state %s: %w (a node's mounts left behind? umount them first)", dir, err)
	}
	return os.MkdirAll(dir, 0o755)
}

// preload writes every reference into one tarball the node bidder imports into each node.
func preload(path string, refs map[name.Reference]v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return tarball.MultiRefWriteToFile(path, refs)
}

// upProc is the running `socialweb up`.
type upProc struct {
	cmd  *exec.Cmd
	done chan error
	kc   string
}

func startUp(ctx context.Context, binary, dataDir, regDir string) (*upProc, error) {
	bin, err := filepath.Abs(binary)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(filepath.Dir(dataDir), "up.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "up", "--data-dir", dataDir, "--node-registry-config", regDir, "--node-flavour", "namespace")
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s up: %w (build it with hack/build.sh)", bin, err)
	}
	p := &upProc{cmd: cmd, done: make(chan error, 1), kc: filepath.Join(dataDir, "kubeconfig")}
	ready := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
			if strings.Contains(sc.Text(), "is ready") {
				ready <- struct{}{}
			}
		}
		p.done <- cmd.Wait()
	}()
	select {
	case <-ready:
		say("up is ready (log %s)", logf.Name())
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("up exited before ready: %v (log %s)", err, logf.Name())
	case <-time.After(2 * time.Minute):
		p.stop(dataDir)
		return nil, fmt.Errorf("up not ready after 2m (log %s)", logf.Name())
	case <-ctx.Done():
		p.stop(dataDir)
		return nil, ctx.Err()
	}
}

// stop deletes the Cluster and waits for it to go (so its nodes are released in order),
// then stops up with SIGTERM.
func (p *upProc) stop(dataDir string) {
	if p.cmd.ProcessState != nil {
		return
	}
	say("deleting the cluster and stopping up")
	_, _ = kubectl(context.Background(), p.kc, "", "delete", "cluster", clusterName, "--ignore-not-found", "--wait=true", "--timeout=3m")
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		say("up did not stop within 90s of SIGTERM; killed")
	}
	// Nodes outlive up by design (the next up finds them again); a run leaves none. A node
	// whose release did not finish before up stopped was left running otherwise.
	if out, err := exec.Command(p.cmd.Path, "node", "sweep", "--release", "--data-dir", dataDir).CombinedOutput(); err != nil {
		say("node sweep --release: %v: %s", err, strings.TrimSpace(string(out)))
	}
}

func kubectl(ctx context.Context, kc, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", kc}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

const (
	clusterName = "conformance"
	// owner is the Cluster's account: the suite runs as the owner's client certificate.
	owner = "did:plc:conformanceowner"
)

// makeCluster creates the Cluster, mints the owner's kubeconfig and keeps one node rented
// with a long-running pod: the suite wants a schedulable node at its start, and a node
// released between specs would cost each spec a new node's boot.
func makeCluster(ctx context.Context, o options, up *upProc, dataDir string, refs map[name.Reference]v1.Image) (string, error) {
	t := time.Now()
	spec := fmt.Sprintf(`apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: %s, namespace: default}
spec: {account: %q, name: %s, running: true, maxNodes: %d, podsPerNode: 1, scaleHold: 6h}
`, clusterName, owner, clusterName, o.maxNodes)
	if _, err := kubectl(ctx, up.kc, spec, "apply", "-f", "-"); err != nil {
		return "", err
	}
	if _, err := kubectl(ctx, up.kc, "", "wait", "--for=jsonpath={.status.phase}=Ready", "--timeout=3m", "cluster/"+clusterName); err != nil {
		return "", err
	}
	kc := filepath.Join(filepath.Dir(dataDir), "tenant.kubeconfig")
	out, err := exec.CommandContext(ctx, up.cmd.Path, "cluster", "kubeconfig", clusterName, "--data-dir", dataDir, "--ttl", "24h", "-o", kc).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("cluster kubeconfig: %v: %s", err, out)
	}
	say("cluster %s Ready in %s", clusterName, since(t))
	var pause string
	for r := range refs {
		if strings.Contains(r.String(), "/k8s/pause:") {
			pause = r.String()
		}
	}
	// Two nodes, each held by a pod the other may not share it with: the suite checks for
	// at least two schedulable nodes ("should have at least two untainted nodes"), and its
	// network specs want pods on two nodes.
	keep := fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: keep-nodes, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: keep-nodes}}
  template:
    metadata: {labels: {app: keep-nodes}}
    spec:
      automountServiceAccountToken: false
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
          - {labelSelector: {matchLabels: {app: keep-nodes}}, topologyKey: kubernetes.io/hostname}
      containers:
      - {name: pause, image: %q}
`, keepNodes, pause)
	if _, err := kubectl(ctx, kc, keep, "apply", "-f", "-"); err != nil {
		return "", err
	}
	if _, err := kubectl(ctx, kc, "", "rollout", "status", "--timeout=5m", "deployment/keep-nodes"); err != nil {
		desc, _ := kubectl(ctx, kc, "", "describe", "pods", "-l", "app=keep-nodes")
		return "", fmt.Errorf("the pods that keep %d nodes rented: %w\n%s", keepNodes, err, tail(desc, 30))
	}
	// The Cluster starts with podsPerNode 1: the scale-up counts pending pods against free
	// slots and does not simulate the scheduler's constraints yet, so with the run's
	// podsPerNode the second keep pod, refused by its anti-affinity, would wait for a node
	// that is never rented. Now that both nodes are there, the run's sizing applies.
	if _, err := kubectl(ctx, up.kc, "", "patch", "cluster", clusterName, "--type=merge", "-p", fmt.Sprintf(`{"spec":{"podsPerNode":%d}}`, o.podsPerNode)); err != nil {
		return "", err
	}
	say("%d nodes are rented and Ready, %s after the cluster", keepNodes, since(t))
	return kc, nil
}

// runSuite runs e2e.test under the ginkgo CLI (parallel processes, one merged JUnit report)
// with a progress line every minute.
func runSuite(ctx context.Context, o options, ginkgo, e2eTest, kc, repoListFile, skip string, selected int, outDir string) error {
	args := []string{
		"--procs=" + strconv.Itoa(o.procs), "--focus=" + o.focus, "--timeout=" + o.timeout.String(),
		"--no-color", "--junit-report=junit.xml", "--output-dir=" + outDir,
	}
	if skip != "" {
		args = append(args, "--skip="+skip)
	}
	args = append(args, e2eTest, "--",
		"--kubeconfig="+kc, "--provider=skeleton", "--report-dir="+outDir,
		// Nodes come and go with demand: the suite must not wait for all to be Ready or for
		// kube-system pods a cluster without add-ons does not have.
		"--allowed-not-ready-nodes="+strconv.Itoa(o.maxNodes), "--minStartupPods=0", "--disable-log-dump",
	)
	logPath := filepath.Join(outDir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, ginkgo, args...)
	cmd.Env = append(os.Environ(), "KUBE_TEST_REPO_LIST="+repoListFile, "KUBECONFIG="+kc)
	var p progress
	cmd.Stdout = io.MultiWriter(logf, &p)
	cmd.Stderr = logf
	say("running %d specs with %d processes (output %s)", selected, o.procs, logPath)
	t := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			p.Flush()
			d, f := p.counts()
			say("suite ended after %s: %d of %d specs ran, %d failed", since(t), d, selected, f)
			return err
		case <-tick.C:
			d, f := p.counts()
			say("%d of %d specs done, %d failed, %s", d, selected, f, since(t))
		}
	}
}
