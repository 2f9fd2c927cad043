package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/testenv"
)

// ctrlProc is a running `socialweb controllers`.
type ctrlProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error // exit, once done is closed
	at   time.Time

	mu    sync.Mutex
	lines []string // stderr so far
}

func startControllers(t *testing.T, args ...string) *ctrlProc {
	t.Helper()
	p := &ctrlProc{cmd: exec.Command(socialwebBin, append([]string{"controllers"}, args...)...), done: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		p.at = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("controllers %v stderr:\n%s", args, p.output())
		}
	})
	return p
}

func (p *ctrlProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// stopWithin sends SIGTERM and returns the exit and how long it took, failing past bound.
func (p *ctrlProc) stopWithin(t *testing.T, bound time.Duration) (time.Duration, error) {
	t.Helper()
	t0 := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.at.Sub(t0), p.err
	case <-time.After(bound):
		t.Fatalf("controllers still running %s after SIGTERM", bound)
		return 0, nil
	}
}

func httpStatus(c *http.Client, url string) (int, string) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b := make([]byte, 512)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode, string(b[:n])
}

// The probes a Deployment points at, metrics behind the API server's authentication, the
// warning of a replica without leader election, and a clean stop on SIGTERM.
func TestControllers_ProbesSecureMetricsAndStop(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	health, metrics := freeAddr(t), freeAddr(t)
	p := startControllers(t, "--kubeconfig", env.Core.KubeconfigPath, "--health-addr", health,
		"--metrics-addr", metrics, "--metrics-secure", "--log-level", "warn")
	c := &http.Client{Timeout: 2 * time.Second}
	testenv.Eventually(t, 30*time.Second, "/healthz and /readyz answer 200", func() (bool, error) {
		h, _ := httpStatus(c, "http://"+health+"/healthz")
		r, _ := httpStatus(c, "http://"+health+"/readyz")
		return h == 200 && r == 200, nil
	})
	if code, body := httpStatus(c, "http://"+health+"/readyz?verbose"); code != 200 || !strings.Contains(body, "[+]caches ok") {
		t.Errorf("/readyz?verbose: %d %q, want the caches check", code, body)
	}
	// Metrics answer only over TLS, and only to a caller the API server authenticates.
	tc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	// The metrics server starts beside the probes, after making its self-signed pair.
	var code int
	var body string
	testenv.Eventually(t, 10*time.Second, "metrics answer over TLS", func() (bool, error) {
		code, body = httpStatus(tc, "https://"+metrics+"/metrics")
		return code != 0, nil
	})
	if code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d %q, want 401", code, body)
	}
	if code, _ := httpStatus(c, "http://"+metrics+"/metrics"); code == 200 {
		t.Error("metrics answered in clear with --metrics-secure")
	}
	if out := p.output(); strings.Count(out, "leader election is off") != 1 {
		t.Errorf("want one warning that leader election is off:\n%s", out)
	}
	if took, err := p.stopWithin(t, 20*time.Second); err != nil {
		t.Errorf("exit %v after SIGTERM (%s), want 0", err, took)
	}
}

// An API server that accepts connections and never answers holds the controllers before
// their manager runs; SIGTERM still ends them within the grace period and the Lease release.
func TestControllers_SIGTERMEndsAStartThatNeverGetsAnAnswer(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	defer srv.Close()
	defer srv.CloseClientConnections()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startControllers(t, "--kubeconfig", kc, "--graceful-shutdown", "2s")
	time.Sleep(2 * time.Second)
	select {
	case <-p.done:
		t.Fatalf("controllers exited before the signal: %v", p.err)
	default:
	}
	// 2 s of grace, 5 s for the Lease, 1 s of margin: the process's own bound.
	took, err := p.stopWithin(t, 15*time.Second)
	if took > 9*time.Second {
		t.Errorf("stopped %s after SIGTERM, want within 8 s", took)
	}
	if err == nil || !strings.Contains(p.output(), "did not stop within") {
		t.Errorf("exit %v; want non-zero, saying the controllers did not stop", err)
	}
}

// A tenant cluster's API server is a kube-apiserver with RBAC and Leases: against it, with
// the socialweb.computer CRDs installed, two replicas hand the Lease over within seconds of
// a SIGTERM, and a ServiceAccount without the rights the controllers need gets one line
// naming what to grant and a prompt non-zero exit.
func TestControllers_TenantLeaderHandoverAndForbidden(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	c := coreClient(t, dir)
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: ctl, namespace: default}
spec: {account: "`+tenantOwner+`", name: ctl, running: true}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: "ctl"}, v1alpha1.ClusterReady, 90*time.Second)
	admin := mint(t, dir, cl)
	tkubectl(t, admin, "", "apply", "--server-side", "-f", "../../config/crd/bases")
	tkubectl(t, admin, "", "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")

	t.Run("forbidden", func(t *testing.T) {
		tkubectl(t, admin, "", "create", "serviceaccount", "nobody", "-n", "default")
		tkubectl(t, admin, "", "create", "serviceaccount", "reader", "-n", "default")
		// reader may read every socialweb.computer kind, and nothing else: not the Lease.
		tkubectl(t, admin, `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: socialweb-reader}
rules: [{apiGroups: [socialweb.computer], resources: ["*"], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: socialweb-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: socialweb-reader}
subjects: [{kind: ServiceAccount, name: reader, namespace: default}]
`, "apply", "-f", "-")
		// The generated ClusterRole in full, and the generated Lease Role less one verb each:
		// the Lease in namespace lc1 may not be created, the one in lc2 not updated (once
		// created and held).
		tkubectl(t, admin, "apiVersion: v1\nkind: Namespace\nmetadata: {name: socialweb-system}\n", "apply", "-f", "-")
		tkubectl(t, admin, "", "apply", "-f", "../../config/rbac/role.yaml")
		for _, sa := range []struct{ name, ns, verbs string }{{"leasenocreate", "lc1", "get, update"}, {"leasenoupdate", "lc2", "get, create"}} {
			tkubectl(t, admin, "", "create", "namespace", sa.ns)
			tkubectl(t, admin, "", "create", "serviceaccount", sa.name, "-n", "default")
			tkubectl(t, admin, fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: %[1]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: socialweb-controllers}
subjects: [{kind: ServiceAccount, name: %[1]s, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leases, namespace: %[2]s}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [%[3]s]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: leases, namespace: %[2]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: leases}
subjects: [{kind: ServiceAccount, name: %[1]s, namespace: default}]
`, sa.name, sa.ns, sa.verbs), "apply", "-f", "-")
		}
		ca := filepath.Join(dir, "tenants", "default", "ctl", "pki", "ca.crt")
		rows := []struct {
			name, sa string
			args     []string
			want     *regexp.Regexp
		}{
			{"no rights: a list", "nobody", nil,
				regexp.MustCompile(`^socialweb: controllers: forbidden: (list|watch) [a-z]+\.socialweb\.computer as system:serviceaccount:default:nobody: grant it \(see config/rbac\)$`)},
			{"no Lease: its get", "reader", []string{"--leader-elect", "--leader-elect-namespace", "default"},
				regexp.MustCompile(`^socialweb: controllers: forbidden: get leases\.coordination\.k8s\.io in namespace default as system:serviceaccount:default:reader: grant it \(see config/rbac\)$`)},
			{"every rule but the Lease's create", "leasenocreate", []string{"--leader-elect", "--leader-elect-namespace", "lc1"},
				regexp.MustCompile(`^socialweb: controllers: forbidden: create leases\.coordination\.k8s\.io in namespace lc1 as system:serviceaccount:default:leasenocreate: grant it \(see config/rbac\)$`)},
			{"every rule but the Lease's update", "leasenoupdate", []string{"--leader-elect", "--leader-elect-namespace", "lc2"},
				regexp.MustCompile(`^socialweb: controllers: forbidden: update leases\.coordination\.k8s\.io in namespace lc2 as system:serviceaccount:default:leasenoupdate: grant it \(see config/rbac\)$`)},
		}
		for _, row := range rows {
			t.Run(row.name, func(t *testing.T) {
				token := strings.TrimSpace(tkubectl(t, admin, "", "create", "token", row.sa, "-n", "default"))
				kc := filepath.Join(t.TempDir(), "kubeconfig")
				if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, cl.Status.Server, ca, token)), 0o600); err != nil {
					t.Fatal(err)
				}
				t0 := time.Now()
				out, code := runCLI(t, append([]string{"controllers", "--kubeconfig", kc}, row.args...)...)
				took := time.Since(t0)
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if code == 0 || !row.want.MatchString(lines[len(lines)-1]) || strings.Count(out, "socialweb: ") != 1 {
					t.Errorf("exit %d, output:\n%s\nwant a non-zero exit and one last line matching %s", code, out, row.want)
				}
				if took > 15*time.Second {
					t.Errorf("exited %s after start, want within 15 s", took)
				}
				t.Logf("exit %d after %s: %s", code, took.Round(time.Millisecond), lines[len(lines)-1])
			})
		}
	})

	t.Run("handover", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", admin)
		if err != nil {
			t.Fatal(err)
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		holder := func() string {
			l, err := cs.CoordinationV1().Leases("default").Get(context.Background(), manager.LeaderElectionID, metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				return ""
			}
			return *l.Spec.HolderIdentity
		}
		args := []string{"--kubeconfig", admin, "--leader-elect", "--leader-elect-namespace", "default", "--log-level", "warn"}
		// The first replica leads (it is alone); the second waits.
		a := startControllers(t, args...)
		var first string
		testenv.Eventually(t, 30*time.Second, "the first replica holds the Lease", func() (bool, error) {
			first = holder()
			return first != "", nil
		})
		b := startControllers(t, args...)
		time.Sleep(3 * time.Second)
		if h := holder(); h != first {
			t.Fatalf("holder changed to %q with two replicas running, want %q", h, first)
		}
		t0 := time.Now()
		_ = a.cmd.Process.Signal(syscall.SIGTERM)
		var second string
		testenv.Eventually(t, 30*time.Second, "the second replica takes the Lease", func() (bool, error) {
			second = holder()
			return second != "" && second != first, nil
		})
		took := time.Since(t0)
		t.Logf("handover in %s: %s -> %s", took.Round(time.Millisecond), first, second)
		if took > 5*time.Second {
			t.Errorf("handover took %s, want under 5 s", took)
		}
		select {
		case <-a.done:
			if a.err != nil {
				t.Errorf("the old leader exited with %v after SIGTERM, want 0", a.err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the old leader still running 20 s after SIGTERM")
		}

		// A replica without --leader-elect says it runs beside the leader, naming it.
		c := startControllers(t, "--kubeconfig", admin, "--leader-elect-namespace", "default", "--log-level", "warn")
		testenv.Eventually(t, 30*time.Second, "the unelected replica warns naming the leader", func() (bool, error) {
			return strings.Contains(c.output(), "leader election is off") && strings.Contains(c.output(), "runningLeader="+second), nil
		})
		if took, err := c.stopWithin(t, 20*time.Second); err != nil {
			t.Errorf("the unelected replica exited with %v after SIGTERM (%s), want 0", err, took)
		}

		// A leader killed outright is replaced once its Lease expires.
		d := startControllers(t, args...)
		time.Sleep(2 * time.Second)
		t0 = time.Now()
		_ = b.cmd.Process.Kill()
		var third string
		testenv.Eventually(t, 30*time.Second, "a third replica takes the Lease of a killed leader", func() (bool, error) {
			third = holder()
			return third != "" && third != second, nil
		})
		took = time.Since(t0)
		t.Logf("takeover after kill -9 in %s", took.Round(time.Millisecond))
		// Expiry counts from the last renewal the waiting replica saw (up to a retry stale),
		// and is noticed at its next retry: two jittered retries past the lease duration.
		if bound := manager.LeaseDuration + 5*time.Second; took > bound {
			t.Errorf("takeover after kill -9 took %s, want within %s (lease duration %s and two retries)", took, bound, manager.LeaseDuration)
		}
		if took, err := d.stopWithin(t, 20*time.Second); err != nil {
			t.Errorf("the last leader exited with %v after SIGTERM (%s), want 0", err, took)
		}
	})
}

// Outside a cluster, no --kubeconfig is one line saying to give one; a grace period that is
// not positive is refused before anything starts.
func TestControllers_BadInputIsOneLine(t *testing.T) {
	rows := []struct {
		name string
		args []string
		want string
	}{
		{"no kubeconfig outside a cluster", []string{"controllers"}, "not running in a cluster"},
		{"grace period of zero", []string{"controllers", "--kubeconfig", kubeconfigOf(t), "--graceful-shutdown", "0s"}, "--graceful-shutdown 0s"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			cmd := exec.Command(socialwebBin, row.args...)
			for _, kv := range os.Environ() {
				// rest.InClusterConfig reads these; a test run inside a pod must not find them.
				if !strings.HasPrefix(kv, "KUBERNETES_SERVICE_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			out, err := cmd.CombinedOutput()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if err == nil || !strings.HasPrefix(lines[len(lines)-1], "socialweb: ") || !strings.Contains(lines[len(lines)-1], row.want) ||
				strings.Count(string(out), "socialweb: ") != 1 {
				t.Errorf("exit %v, output %q: want one error line mentioning %q", err, out, row.want)
			}
		})
	}
}
