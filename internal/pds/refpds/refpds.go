// Package refpds starts the reference TypeScript PDS (@atproto/pds, pinned in
// test/peers/atproto-pds) on free loopback ports for interop tests, and runs the official
// TypeScript client script under test/interop/ts-client.
//
// Node 22 and the PDS install into <repo>/.cache/refpds on first use (2-4 minutes cold). Tests
// that need the peer call Require: with CI=true a peer that cannot start fails the test, so
// interop is never skipped silently in CI; elsewhere the tests run only when
// SOCIALWEB_INTEROP=1 is set.
package refpds

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Peer is a running reference PDS with its did:plc directory.
type Peer struct {
	PDSURL string // http://127.0.0.1:<port>
	PLCURL string
	Dir    string // install/work directory
	pids   []int
}

// Enabled reports whether interop tests should run here.
func Enabled() bool {
	return os.Getenv("CI") == "true" || os.Getenv("SOCIALWEB_INTEROP") == "1"
}

// Require skips the test unless interop is enabled; when enabled, it starts a peer or fails.
func Require(t testing.TB) *Peer { t.Helper(); return RequireWith(t, Options{}) }

// RequireWith is Require with opts.
func RequireWith(t testing.TB, opts Options) *Peer {
	t.Helper()
	if !Enabled() {
		t.Skip("reference PDS interop: set SOCIALWEB_INTEROP=1 (CI=true runs it always)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	p, err := StartWith(ctx, opts)
	if err != nil {
		t.Fatalf("reference PDS could not start: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

// RepoRoot finds the module root (the directory holding go.mod) from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// FreePort asks the kernel for a free loopback port.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Start installs (once) and starts the reference PDS and its PLC stub: open sign-up, no rate
// limits, admin password "admin-pass".
func Start(ctx context.Context) (*Peer, error) { return StartWith(ctx, Options{}) }

// Options change how the peer is configured.
type Options struct {
	// InviteRequired starts it with PDS_INVITE_REQUIRED=true.
	InviteRequired bool
	// RateLimits starts it with PDS_RATE_LIMITS_ENABLED=true (in-memory limiters).
	RateLimits bool
	// ResolveDIDs lets the peer resolve DIDs (service-auth issuers) through its directory:
	// it fetches no URL with an IP host, so it is given the directory as localhost.
	ResolveDIDs bool
}

// AdminPassword is the peer's PDS_ADMIN_PASSWORD.
const AdminPassword = "admin-pass"

// StartWith is Start with opts.
func StartWith(ctx context.Context, opts Options) (*Peer, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	work := filepath.Join(root, ".cache", "refpds")
	pdsPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	plcPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, "test", "peers", "atproto-pds", "run.sh")
	cmd := exec.CommandContext(ctx, "bash", script, work, strconv.Itoa(pdsPort), strconv.Itoa(plcPort))
	cmd.Env = append(os.Environ(), fmt.Sprintf("PEER_INVITE_REQUIRED=%t", opts.InviteRequired), fmt.Sprintf("PEER_RATE_LIMITS_ENABLED=%t", opts.RateLimits))
	if opts.ResolveDIDs {
		cmd.Env = append(cmd.Env, "PEER_PLC_HOST=localhost")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("run.sh: %v: %s%s", err, stderr.String(), tail(filepath.Join(work, "pds-install.log")))
	}
	p := &Peer{Dir: work}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "PDS_URL":
			// Talk to loopback by address: no name goes through the resolver.
			p.PDSURL = strings.Replace(v, "localhost", "127.0.0.1", 1)
		case "PLC_URL":
			p.PLCURL = v
		case "PDS_PID", "PLC_PID":
			if n, err := strconv.Atoi(v); err == nil {
				p.pids = append(p.pids, n)
			}
		}
	}
	if p.PDSURL == "" || len(p.pids) != 2 {
		p.Stop()
		return nil, fmt.Errorf("run.sh printed no PDS_URL/pids: %s", out)
	}
	return p, nil
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\n" + path + ":\n" + string(b)
}

// Stop kills the two processes the peer started.
func (p *Peer) Stop() {
	for _, pid := range p.pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range p.pids {
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(50 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.pids = nil
}

// Node returns the Node 22 binary the peer installed.
func (p *Peer) Node() string {
	return filepath.Join(p.Dir, "node22", "node_modules", ".bin", "node")
}

// RunTSClient installs (once) test/interop/ts-client and runs its client.mjs against pdsURL.
// It returns the script's stdout.
func (p *Peer) RunTSClient(ctx context.Context, pdsURL, handle, password string) ([]byte, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(root, "test", "interop", "ts-client")
	dst := filepath.Join(p.Dir, "ts-client")
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	for _, f := range []string{"package.json", "package-lock.json", "client.mjs"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o644); err != nil {
			return nil, err
		}
	}
	nodeBin := filepath.Dir(p.Node())
	env := append(os.Environ(), "PATH="+nodeBin+":"+os.Getenv("PATH"))
	if _, err := os.Stat(filepath.Join(dst, "node_modules", "@atproto", "api")); err != nil {
		ci := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund")
		ci.Dir, ci.Env = dst, env
		if out, err := ci.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("npm ci: %v: %s", err, out)
		}
	}
	run := exec.CommandContext(ctx, p.Node(), "client.mjs", pdsURL, handle, password)
	run.Dir, run.Env = dst, env
	var stderr bytes.Buffer
	run.Stderr = &stderr
	out, err := run.Output()
	if err != nil {
		return out, fmt.Errorf("client.mjs: %v: %s", err, stderr.String())
	}
	return out, nil
}

// Healthy reports whether the peer answers.
func (p *Peer) Healthy() bool {
	resp, err := http.Get(p.PDSURL + "/xrpc/_health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// EmailToken reads from the peer's account database the token it mailed to did for purpose
// (e.g. "delete_account"): the peer has no SMTP server, so its mail goes nowhere. It uses the
// SQLite module built into the peer's Node.
func (p *Peer) EmailToken(ctx context.Context, did, purpose string) (string, error) {
	_, port, ok := strings.Cut(strings.TrimPrefix(p.PDSURL, "http://"), ":")
	if !ok {
		return "", fmt.Errorf("no port in %s", p.PDSURL)
	}
	db := filepath.Join(p.Dir, "data-"+port, "account.sqlite")
	const script = `const {DatabaseSync} = require('node:sqlite');
const db = new DatabaseSync(process.argv[1], {readOnly: true});
const row = db.prepare('SELECT token FROM email_token WHERE did = ? AND purpose = ?').get(process.argv[2], process.argv[3]);
process.stdout.write(row ? row.token : '');`
	out, err := exec.CommandContext(ctx, p.Node(), "--no-warnings", "-e", script, db, did, purpose).Output()
	if err != nil {
		return "", fmt.Errorf("reading the peer's email token: %w", err)
	}
	if len(out) == 0 {
		return "", fmt.Errorf("the peer holds no %s token for %s", purpose, did)
	}
	return string(out), nil
}
