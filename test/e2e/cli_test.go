package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/testenv"
)

// upProc is a running `socialweb up`.
type upProc struct {
	cmd  *exec.Cmd
	done chan error
	dir  string

	mu     sync.Mutex
	phases []string // its stderr lines so far
}

// phase waits for a phase line containing prefix and returns the word after it (a URL, say).
func (p *upProc) phase(t *testing.T, prefix string) string {
	t.Helper()
	var word string
	testenv.Eventually(t, 10*time.Second, "phase line "+prefix, func() (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, l := range p.phases {
			if _, rest, ok := strings.Cut(l, prefix); ok {
				word, _, _ = strings.Cut(strings.TrimSpace(rest), " ")
				return true, nil
			}
		}
		return false, nil
	})
	return word
}

// line waits for a phase line containing s and returns it whole.
func (p *upProc) line(t *testing.T, s string) string {
	t.Helper()
	p.phase(t, s)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.phases {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

func startUp(t *testing.T, dir string, args ...string) *upProc {
	t.Helper()
	return startUpWith(t, dir, nil, args...)
}

// startUpWith is startUp with the command adjusted by with (its environment, its working
// directory) before it starts.
func startUpWith(t *testing.T, dir string, with func(*exec.Cmd), args ...string) *upProc {
	t.Helper()
	if !slices.Contains(args, "--node-flavour") {
		// Whatever image a developer built where up looks by default: the rows that do not
		// name a flavour are written for namespace nodes.
		args = append(args, "--node-flavour", "namespace")
	}
	if !slices.Contains(args, "--node-dns-upstream") {
		// Nodes' DNS servers forward nothing off this machine: a row that forwards names
		// names its own upstream, a server in a namespace standing for the internet.
		args = append(args, "--node-dns-upstream", "none")
	}
	// Pods of the rows reach nothing beyond their cluster but the namespace that stands for
	// the internet (substratetest.NewInternet): no address off this machine.
	args = append(args, "--node-egress-deny", strings.Join(testEgressDeny, ","), "--node-egress-allow", strings.Join(testEgressAllow, ","))
	cmd := exec.Command(socialwebBin, append([]string{"up", "--data-dir", dir}, args...)...)
	if with != nil {
		with(cmd)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// A pipe of our own rather than StderrPipe: Wait must not wait for its readers, since a
	// guest process up started may keep the write end open after up exits.
	stderr, stderrW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = stderrW
	err = cmd.Start()
	stderrW.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := &upProc{cmd: cmd, done: make(chan error, 1), dir: dir}
	go func() {
		defer stderr.Close()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(os.Stderr, sc.Text())
			p.mu.Lock()
			p.phases = append(p.phases, sc.Text())
			p.mu.Unlock()
		}
	}()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "is ready") {
				ready <- sc.Text()
			}
		}
		p.done <- cmd.Wait()
	}()
	// Once up is stopped: the nodes it rented and its deno bidder's guests outlive it (a
	// restarted up adopts them), and the test gives them up.
	t.Cleanup(func() { releaseUpNodes(t, dir); stopUpGuests(t, dir) })
	t.Cleanup(func() { p.stop(t) })
	select {
	case line := <-ready:
		if !strings.Contains(line, filepath.Join(dir, "kubeconfig")) {
			t.Errorf("ready line %q does not name the kubeconfig", line)
		}
	case err := <-p.done:
		t.Fatalf("up exited before ready: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("up not ready after 60s")
	}
	return p
}

// stop sends SIGTERM and requires a clean exit.
func (p *upProc) stop(t *testing.T) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("up exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		t.Error("up did not stop within 30s of SIGTERM")
	}
}

func (p *upProc) kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, err := kubectlRun(p.dir, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func kubectlRun(dir, stdin string, args ...string) (string, error) {
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", filepath.Join(dir, "kubeconfig")}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// runCLI runs the binary and returns its output and exit code.
func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, socialwebBin, args...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

const walkthroughInfra = `apiVersion: socialweb.computer/v1alpha1
kind: Infra
metadata:
  name: web
  namespace: default
spec:
  description: a small web app
  contracts:
  - name: api
    computeKind: deno
    userData: console.log("hi")
`

func TestCLI_UpKubectlWalkthroughLockSignalAndRestart(t *testing.T) {
	requireTool(t, "kubectl")
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)

	// A second up on the same data dir fails at once, with one line.
	out, code := runCLI(t, "up", "--data-dir", dir)
	if code == 0 || !strings.Contains(out, "in use") || strings.Count(out, "socialweb: ") != 1 {
		t.Errorf("second up: exit %d, output %q; want one line saying the data dir is in use", code, out)
	}

	res := up.kubectl(t, "", "api-resources", "--api-group=socialweb.computer", "-o", "name")
	for _, r := range []string{"infras", "ephemeralinfras", "infracollections", "ephemeralinfracollections", "computecontracts",
		"atprotorepos", "atprotorecords", "atprotorecordwatches", "clusters", "nodeclaims"} {
		if !strings.Contains(res, r+".socialweb.computer") {
			t.Errorf("api-resources does not list %s:\n%s", r, res)
		}
	}
	// Credentials are core Secrets, served beside the kinds above.
	if core := up.kubectl(t, "", "api-resources", "--api-group=", "-o", "name"); strings.TrimSpace(core) != "secrets" {
		t.Errorf("the core group lists %q, want secrets alone", core)
	}
	if out := up.kubectl(t, "", "explain", "infra.spec.contracts.state"); !strings.Contains(out, "Staged") {
		t.Errorf("explain does not document the states:\n%s", out)
	}
	up.kubectl(t, walkthroughInfra, "apply", "-f", "-")
	up.kubectl(t, "", "wait", "--for=condition=Ready", "--timeout=30s", "infra/web")
	if out := up.kubectl(t, "", "get", "infras"); !strings.Contains(out, "PHASE") || !strings.Contains(out, "Staged") || !strings.Contains(out, "0/0") {
		t.Errorf("get infras:\n%s", out)
	}
	if out := up.kubectl(t, "", "describe", "infra", "web"); !strings.Contains(out, "a small web app") {
		t.Errorf("describe:\n%s", out)
	}
	up.kubectl(t, "", "patch", "infra", "web", "--type=merge", "-p", `{"spec":{"description":"the api"}}`)
	up.kubectl(t, "", "wait", "--for=jsonpath={.status.observedGeneration}=2", "--timeout=30s", "infra/web")
	if out, err := kubectlRun(dir, "", "patch", "infra", "web", "--type=merge", "-p", `{"spec":{"contracts":[{"name":"API"}]}}`); err == nil || !strings.Contains(out, "spec.contracts[0].name") {
		t.Errorf("invalid patch: err %v, output %s", err, out)
	}
	up.kubectl(t, walkthroughInfra, "apply", "-f", "-")
	keep := strings.Replace(walkthroughInfra, "name: web", "name: kept", 1)
	up.kubectl(t, keep, "apply", "-f", "-")
	up.kubectl(t, "", "delete", "infra", "web", "--wait=true", "--timeout=30s")
	if out, code := runCLI(t, "cluster", "kubeconfig", "nope", "--data-dir", dir); code == 0 || !strings.Contains(out, "cluster default/nope not found") {
		t.Errorf("cluster kubeconfig of a missing cluster: exit %d, %q", code, out)
	}

	// SIGTERM stops it cleanly; a restart keeps every object.
	up.stop(t)
	up = startUp(t, dir)
	out = up.kubectl(t, "", "get", "infras", "-o", "name")
	if strings.TrimSpace(out) != "infra.socialweb.computer/kept" {
		t.Errorf("after restart: %q, want only infra/kept", out)
	}
}

func TestCLI_ControllersRunAgainstASeparateCore(t *testing.T) {
	env := testenv.Start(t, testenv.Options{}) // a core with no controllers in it
	cmd := exec.Command(socialwebBin, "controllers", "--kubeconfig", env.Core.KubeconfigPath, "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("controllers exited with %v after SIGTERM", err)
		}
	}()
	ctx := context.Background()
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "remote", Namespace: "acct-test"},
		Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "a"}, {Name: "b"}}}}
	if err := env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the separate controllers process reconciles", func() (bool, error) {
		var got v1alpha1.Infra
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(inf), &got)
		return err == nil && got.Status.Phase == v1alpha1.InfraStaged && got.Status.ContractsReady == "0/0", err
	})

	// The README walk-through's local repo names an account on up's embedded PDS, which
	// these controllers do not run: the repo says so, and what to write instead.
	local := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Name: "me", Namespace: "acct-test"},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: "owner.test"}}}
	if err := env.Client.Create(ctx, local); err != nil {
		t.Fatal(err)
	}
	var ready *metav1.Condition
	testenv.Eventually(t, 30*time.Second, "the local repo reports LocalRepoUnavailable", func() (bool, error) {
		var got v1alpha1.AtprotoRepo
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(local), &got)
		ready = meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
		return err == nil && ready != nil && ready.Reason == string(v1alpha1.ReasonLocalRepoUnavailable), err
	})
	if ready.Status != metav1.ConditionFalse || !strings.Contains(ready.Message, "spec.remote") || !strings.Contains(ready.Message, "credentialsRef") {
		t.Errorf("Ready of a local repo under socialweb controllers: %+v", ready)
	}
}

func TestCLI_BadInputIsOneLineAndNonZero(t *testing.T) {
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "mine.txt"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(unreadable, []byte("{{{ not yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	rows := []struct {
		name string
		args []string
		want string
	}{
		{"foreign data dir", []string{"up", "--data-dir", foreign}, "not a socialweb data dir"},
		{"port in use", []string{"up", "--data-dir", filepath.Join(t.TempDir(), "d"), "--listen", ln.Addr().String()}, "address already in use"},
		{"unreadable kubeconfig", []string{"controllers", "--kubeconfig", unreadable}, "kubeconfig"},
		{"missing kubeconfig", []string{"controllers", "--kubeconfig", filepath.Join(t.TempDir(), "nope")}, "no such file"},
		{"unknown command", []string{"launch"}, "unknown command"},
		{"bad log level", []string{"up", "--data-dir", filepath.Join(t.TempDir(), "d"), "--log-level", "loud"}, "--log-level"},
		{"pprof off this machine", []string{"up", "--data-dir", filepath.Join(t.TempDir(), "d"), "--pprof-addr", "0.0.0.0:6060"}, "pprof address 0.0.0.0:6060: want a loopback address"},
		{"negative node bid window", []string{"up", "--data-dir", filepath.Join(t.TempDir(), "d"), "--node-bid-window", "-1s"}, "node bid window -1s"},
		{"gateway without a running up", []string{"serve", "gateway", "--data-dir", filepath.Join(t.TempDir(), "d")}, "is socialweb up running"},
		{"cluster kubeconfig without a running up", []string{"cluster", "kubeconfig", "demo", "--data-dir", filepath.Join(t.TempDir(), "d")}, "give --data-dir of a socialweb up"},
		{"cluster kubeconfig ttl under a minute", []string{"cluster", "kubeconfig", "demo", "--ttl", "30s"}, "--ttl 30s is outside 1m0s..24h0m0s"},
		{"cluster kubeconfig ttl and no-expiry", []string{"cluster", "kubeconfig", "demo", "--ttl", "1h", "--no-expiry"}, "exclusive"},
		{"PDS public URL an IP address", []string{"pds", "serve", "--data-dir", filepath.Join(t.TempDir(), "d"), "--public-url", "https://203.0.113.7"}, "--public-url: public URL \"https://203.0.113.7\": an IP address"},
		{"PDS relay without a public URL", []string{"up", "--data-dir", filepath.Join(t.TempDir(), "d"), "--pds-relay", "https://relay.example.test"}, "needs --pds-public-url"},
		{"gateway public URL with a port", []string{"serve", "gateway", "--kubeconfig", kubeconfigOf(t), "--public-url", "https://gw.example.test:8443"}, "only for localhost"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			out, code := runCLI(t, row.args...)
			if code == 0 {
				t.Fatalf("exit 0, want non-zero; output %q", out)
			}
			// Progress lines may come first; the error is the last line, and the only one.
			lines := strings.Split(strings.TrimSpace(out), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "socialweb: ") || !strings.Contains(last, row.want) || strings.Count(out, "socialweb: ") != 1 {
				t.Errorf("output %q: want one error line starting 'socialweb: ' and mentioning %q", out, row.want)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(foreign, "mine.txt")); string(b) != "keep" {
		t.Error("the foreign data dir was changed")
	}
	if entries, _ := os.ReadDir(foreign); len(entries) != 1 {
		t.Errorf("the foreign data dir gained files: %v", entries)
	}
}

func TestCLI_HelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"up", "--help"}, {"controllers", "--help"}, {"pds", "serve", "--help"}, {"serve", "gateway", "--help"}, {"bench", "core", "--help"}, {"bench", "tenant", "--help"}, {"kube", "--help"}, {"version", "--help"}} {
		out, code := runCLI(t, args...)
		if code != 0 || !strings.Contains(out, "Usage:") {
			t.Errorf("%v: exit %d, output %q", args, code, out)
		}
	}
	out, code := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "socialweb ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
	// The Kubernetes line is the version of k8s.io/kubernetes in go.mod, the one tenant
	// apiservers serve at /version (internal/kubeversion).
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s.io/kubernetes (v\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod requires no k8s.io/kubernetes")
	}
	if want := "\nkubernetes " + string(m[1]) + " "; !strings.Contains(out, want) {
		t.Errorf("version: %q, want a line %q", out, want)
	}
}

func TestCLI_PDSServeAlone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pds")
	cmd := exec.Command(socialwebBin, "pds", "serve", "--data-dir", dir, "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("pds serve exited with %v after SIGTERM", err)
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no ready line: %v", err)
	}
	f := strings.Fields(line) // PDS serving at URL (PLC URL); account HANDLE DID, ...
	if len(f) < 4 || !strings.HasPrefix(f[3], "http://127.0.0.1:") || !strings.Contains(line, "owner.test did:plc:") {
		t.Fatalf("ready line %q", line)
	}
	resp, err := http.Get(f[3] + "/xrpc/com.atproto.server.describeServer")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("describeServer: %d", resp.StatusCode)
	}
	resp, err = http.Get(f[3] + "/xrpc/com.atproto.identity.resolveHandle?handle=owner.test")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("resolveHandle of the default account: %d", resp.StatusCode)
	}
}

// kubeconfigOf is a syntactically valid kubeconfig whose server nothing serves: enough for a
// command to get past reading it.
func kubeconfigOf(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n" +
		"users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// stopUpGuests stops and removes the deno guests up's bidder left in dir, as that bidder
// would on a release, so that no row leaves a process (or its cgroups and uid) behind.
func stopUpGuests(t *testing.T, dir string) {
	t.Helper()
	guests := filepath.Join(dir, "bidder", "guests")
	if _, err := os.Stat(guests); err != nil {
		return
	}
	ctx := context.Background()
	cfg := deno.Config{StateDir: guests}
	if deno.DefaultBinary() == "" {
		cfg.Deno = "/bin/true" // up found a deno this process does not; Stop and Remove run none
	}
	sub, err := deno.New(cfg)
	if err != nil {
		t.Errorf("the guests up left in %s: %v", guests, err)
		return
	}
	gs, err := sub.List(ctx)
	if err != nil {
		t.Errorf("the guests up left in %s: %v", guests, err)
	}
	for _, g := range gs {
		if err := sub.Stop(ctx, g.ID); err != nil {
			t.Errorf("stop guest %s that up left: %v", g.ID, err)
		}
		if err := sub.Remove(ctx, g.ID); err != nil {
			t.Errorf("remove guest %s that up left: %v", g.ID, err)
		}
	}
}
