package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
)

// interruptAtCleanup ends cmd when the test ends: an interrupt, then a kill after 10 s.
func interruptAtCleanup(t *testing.T, cmd *exec.Cmd) {
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// pdsServe is a running `socialweb pds serve` and the lines it printed.
type pdsServe struct {
	url   string
	lines []string
}

// startPDSServe runs `socialweb pds serve` with args and env, waits for its serving line and
// stops it at cleanup.
func startPDSServe(t *testing.T, dir string, env []string, args ...string) *pdsServe {
	t.Helper()
	cmd := exec.Command(socialwebBin, append([]string{"pds", "serve", "--data-dir", dir, "--log-level", "warn"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	interruptAtCleanup(t, cmd)
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	p := &pdsServe{}
	deadline := time.After(30 * time.Second)
	for p.url == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("pds serve exited; printed %q", p.lines)
			}
			p.lines = append(p.lines, l)
			if _, rest, ok := strings.Cut(l, "PDS serving at "); ok {
				p.url, _, _ = strings.Cut(rest, " ")
			}
		case <-deadline:
			t.Fatal("pds serve printed no serving line in 30s")
		}
	}
	// The password line follows the serving line on a first start.
	select {
	case l, ok := <-lines:
		if ok {
			p.lines = append(p.lines, l)
		}
	case <-time.After(500 * time.Millisecond):
	}
	return p
}

// xrpcPost posts a JSON procedure from the local address from (nil: any).
func xrpcPost(t *testing.T, from net.IP, url, method, authz string, in any) (int, http.Header, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", url+"/xrpc/"+method, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, resp.Header, out
}

// A stranger who reaches `socialweb pds serve` cannot sign up without an invite code; the
// operator (admin password from the environment) mints one and it works once. Open sign-up
// is refused at start on a non-loopback address.
func TestSecurityPDS_SignupNeedsInvite(t *testing.T) {
	dir := t.TempDir()
	p := startPDSServe(t, dir, []string{app.AdminPasswordEnv + "=operator-secret"})
	ctx := context.Background()
	// The operator's own account: its password printed once, in no file, good for a login.
	var ownerPW string
	for _, l := range p.lines {
		if _, rest, ok := strings.Cut(l, "password of owner.test: "); ok {
			ownerPW, _, _ = strings.Cut(rest, " ")
		}
	}
	if ownerPW == "" {
		t.Fatalf("pds serve printed no password for its account: %q", p.lines)
	}
	if hits := filesHolding(t, dir, ownerPW); len(hits) > 0 {
		t.Fatalf("the account's password is at rest in %v", hits)
	}
	if _, err := atclient.New(p.url).Login(ctx, "owner.test", ownerPW); err != nil {
		t.Fatalf("the printed password: %v", err)
	}
	var desc struct {
		InviteCodeRequired bool `json:"inviteCodeRequired"`
	}
	if err := atclient.New(p.url).Call(ctx, "com.atproto.server.describeServer", nil, nil, &desc, false); err != nil || !desc.InviteCodeRequired {
		t.Fatalf("describeServer: %+v %v", desc, err)
	}
	if _, err := atclient.New(p.url).CreateAccount(ctx, "stranger.test", "stranger-pw", ""); !atclient.IsXRPC(err, "InvalidInviteCode") {
		t.Fatalf("sign-up without an invite: %v, want InvalidInviteCode", err)
	}
	if _, err := atclient.New(p.url).CreateAccountWithInvite(ctx, "stranger.test", "stranger-pw", "", "localhost-abcde-fghij"); !atclient.IsXRPC(err, "InvalidInviteCode") {
		t.Fatalf("sign-up with a made-up invite: %v, want InvalidInviteCode", err)
	}
	if _, err := atclient.New(p.url).Login(ctx, "stranger.test", "stranger-pw"); !atclient.IsXRPC(err, "AuthenticationRequired") {
		t.Fatalf("a refused sign-up left an account: %v", err)
	}
	req, _ := http.NewRequest("GET", "http://x", nil)
	req.SetBasicAuth("admin", "a-guess")
	if st, _, body := xrpcPost(t, nil, p.url, "com.atproto.server.createInviteCode", req.Header.Get("Authorization"), map[string]any{"useCount": 1}); st != 401 {
		t.Fatalf("createInviteCode with a wrong admin password: %d %v", st, body)
	}
	req.SetBasicAuth("admin", "operator-secret")
	st, _, body := xrpcPost(t, nil, p.url, "com.atproto.server.createInviteCode", req.Header.Get("Authorization"), map[string]any{"useCount": 1})
	code, _ := body["code"].(string)
	if st != 200 || code == "" {
		t.Fatalf("createInviteCode as the operator: %d %v", st, body)
	}
	if _, err := atclient.New(p.url).CreateAccountWithInvite(ctx, "invited.test", "invited-pw", "", code); err != nil {
		t.Fatalf("sign-up with the operator's invite: %v", err)
	}
	if _, err := atclient.New(p.url).CreateAccountWithInvite(ctx, "second.test", "second-pw", "", code); !atclient.IsXRPC(err, "InvalidInviteCode") {
		t.Fatalf("a one-use invite taken twice: %v", err)
	}

	// --open-signup on a reachable address: refused at start, with the reason.
	out, err := exec.Command(socialwebBin, "pds", "serve", "--data-dir", t.TempDir(), "--listen", "0.0.0.0:0", "--open-signup").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "loopback") {
		t.Fatalf("pds serve --open-signup on 0.0.0.0: %v %s", err, out)
	}
	open := startPDSServe(t, t.TempDir(), nil, "--open-signup")
	if _, err := atclient.New(open.url).CreateAccount(ctx, "lola.test", "local-pw", ""); err != nil {
		t.Fatalf("open sign-up on loopback: %v", err)
	}
}

// Password guessing against `socialweb pds serve`: after 30 attempts on one account within
// 5 minutes the next is refused with 429 RateLimitExceeded, even with the right password;
// the account's bucket is shared by every address, so another address is refused too, while
// another account from another address logs in.
func TestSecurityPDS_LoginGuessingRateLimited(t *testing.T) {
	dir := t.TempDir()
	p := startPDSServe(t, dir, nil, "--open-signup")
	ctx := context.Background()
	if _, err := atclient.New(p.url).CreateAccount(ctx, "victim.test", "victim-password", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := atclient.New(p.url).CreateAccount(ctx, "bystander.test", "bystander-password", ""); err != nil {
		t.Fatal(err)
	}
	one, two := net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2)
	for i := range 30 {
		st, h, body := xrpcPost(t, one, p.url, "com.atproto.server.createSession", "", map[string]any{"identifier": "victim.test", "password": "guess"})
		if st != 401 || body["error"] != "AuthenticationRequired" || h.Get("RateLimit-Limit") != "30" {
			t.Fatalf("guess %d: %d %v %v", i, st, body, h)
		}
	}
	st, h, body := xrpcPost(t, one, p.url, "com.atproto.server.createSession", "", map[string]any{"identifier": "victim.test", "password": "victim-password"})
	if st != 429 || body["error"] != "RateLimitExceeded" || h.Get("RateLimit-Remaining") != "0" || h.Get("RateLimit-Policy") != "30;w=300" || h.Get("Retry-After") == "" {
		t.Fatalf("attempt 31 (the right password): %d %v %v", st, body, h)
	}
	if st, _, body := xrpcPost(t, two, p.url, "com.atproto.server.createSession", "", map[string]any{"identifier": "victim.test", "password": "victim-password"}); st != 429 {
		t.Fatalf("the guessed account from another address: %d %v", st, body)
	}
	if st, _, body := xrpcPost(t, two, p.url, "com.atproto.server.createSession", "", map[string]any{"identifier": "bystander.test", "password": "bystander-password"}); st != 200 {
		t.Fatalf("another account from another address: %d %v", st, body)
	}
}

// filesHolding lists the files under dir whose bytes contain secret.
func filesHolding(t *testing.T, dir, secret string) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a file removed while walking (logs, temporaries)
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if bytes.Contains(b, []byte(secret)) {
			hits = append(hits, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// The data dir of `up` holds no account password: the owner's, printed once, is in no file;
// every account.json (owner, bidder, node bidder) holds a handle and DID only, mode 0600. A
// restart works and prints no password; a data dir of the old format (password in clear in
// account.json) is migrated at start: that password stops working and a new one is printed.
func TestSecurityPDS_NoPasswordAtRest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	pdsURL := up.phase(t, "PDS serving at ")
	owner := localAccount(t, up)
	ctx := context.Background()
	if _, err := atclient.New(pdsURL).Login(ctx, owner.Handle, owner.Password); err != nil {
		t.Fatalf("the printed password: %v", err)
	}
	up.phase(t, "controllers started") // the local bidders' accounts exist (where they run)
	checkDataDir := func(secret string) {
		t.Helper()
		if hits := filesHolding(t, dir, secret); len(hits) > 0 {
			t.Fatalf("the owner's password is at rest in %v", hits)
		}
		accounts, _ := filepath.Glob(filepath.Join(dir, "*", "account.json"))
		if len(accounts) == 0 {
			t.Fatal("no account.json in the data dir")
		}
		for _, path := range accounts {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var f map[string]any
			if err := json.Unmarshal(b, &f); err != nil {
				t.Fatal(err)
			}
			if _, ok := f["password"]; ok || len(f) != 2 || f["did"] == nil || f["handle"] == nil {
				t.Fatalf("%s holds more than a handle and DID: %s", path, b)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Fatalf("%s mode %v, want 0600", path, fi.Mode().Perm())
			}
		}
	}
	checkDataDir(owner.Password)

	// A restart: the same account, no password printed, the printed one still good.
	up.stop(t)
	up = startUp(t, dir)
	pdsURL = up.phase(t, "PDS serving at ")
	up.phase(t, "controllers started")
	up.mu.Lock()
	lines := append([]string(nil), up.phases...)
	up.mu.Unlock()
	for _, l := range lines {
		if strings.Contains(l, "password of ") {
			t.Fatalf("a restart printed a password: %q", l)
		}
	}
	if _, err := atclient.New(pdsURL).Login(ctx, owner.Handle, owner.Password); err != nil {
		t.Fatalf("the password after a restart: %v", err)
	}
	checkDataDir(owner.Password)

	// The old format: account.json with the password in clear, as earlier versions wrote
	// it (readable by whoever read the file). The next start replaces it.
	up.stop(t)
	old, _ := json.Marshal(map[string]string{"handle": owner.Handle, "did": owner.DID, "password": owner.Password})
	if err := os.WriteFile(filepath.Join(dir, "pds", "account.json"), old, 0o644); err != nil {
		t.Fatal(err)
	}
	up = startUp(t, dir)
	pdsURL = up.phase(t, "PDS serving at ")
	fresh := up.phase(t, "password of "+owner.Handle+": ")
	if fresh == "" || fresh == owner.Password {
		t.Fatalf("migration printed %q", fresh)
	}
	if _, err := atclient.New(pdsURL).Login(ctx, owner.Handle, owner.Password); !atclient.IsXRPC(err, "AuthenticationRequired") {
		t.Fatalf("the password that was in clear still logs in after the migration: %v", err)
	}
	if _, err := atclient.New(pdsURL).Login(ctx, owner.Handle, fresh); err != nil {
		t.Fatalf("the password printed by the migration: %v", err)
	}
	checkDataDir(owner.Password)
	checkDataDir(fresh)
}
