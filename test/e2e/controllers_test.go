package e2e

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
func (p *ctrlProc) stopWithin(t *testing.T, bound time.Duration) (error, time.Duration) {
	t.Helper()
	t0 := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err, p.at.Sub(t0)
	case <-time.After(bound):
		t.Fatalf("controllers still running %s after SIGTERM", bound)
		return nil, 0
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
	if code, body := httpStatus(tc, "https://"+metrics+"/metrics"); code != http.StatusUnauthorized {
		t.Errorf("metrics without a token: %d %q, want 401", code, body)
	}
	if code, _ := httpStatus(c, "http://"+metrics+"/metrics"); code == 200 {
		t.Error("metrics answered in clear with --metrics-secure")
	}
	if out := p.output(); strings.Count(out, "leader election is off") != 1 {
		t.Errorf("want one warning that leader election is off:\n%s", out)
	}
	if err, took := p.stopWithin(t, 20*time.Second); err != nil {
		t.Errorf("exit %v after SIGTERM (%s), want 0", err, took)
	}
}

// An API server that accepts connections and never answers holds the controllers before
// their manager runs; SIGTERM still ends them within the grace period and the Lease release.
func TestControllers_SIGTERMEndsAStartThatNeverGetsAnAnswer(t *testing.T) {
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
	err, took := p.stopWithin(t, 15*time.Second)
	if took > 9*time.Second {
		t.Errorf("stopped %s after SIGTERM, want within 8 s", took)
	}
	if err == nil || !strings.Contains(p.output(), "did not stop within") {
		t.Errorf("exit %v; want non-zero, saying the controllers did not stop", err)
	}
}
