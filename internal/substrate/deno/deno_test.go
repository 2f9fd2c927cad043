package deno

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/substratetest"
)

func newSub(t *testing.T) (*Substrate, string) {
	t.Helper()
	return newSubWith(t, Config{})
}

// newSubWith is a substrate of cfg with a state dir of the test's.
func newSubWith(t *testing.T, cfg Config) (*Substrate, string) {
	t.Helper()
	substratetest.Require(t, DefaultBinary() != "", "deno", "run hack/install-deno.sh")
	dir := t.TempDir()
	cfg.StateDir = dir
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, dir)
	return s, dir
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestExitsWithOutput(t *testing.T) {
	s, _ := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		id   string
		prog string
		code int
	}{
		{"ok", `console.log("hello from the guest"); console.error("and stderr");`, 0},
		{"code3", `console.log("bye"); Deno.exit(3);`, 3},
	} {
		if _, err := s.Boot(ctx, substrate.GuestSpec{ID: tc.id, UserData: []byte(tc.prog)}); err != nil {
			t.Fatal(err)
		}
		st, err := substrate.WaitEnded(ctx, s, tc.id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Phase != substrate.Exited || st.ExitCode != tc.code {
			t.Fatalf("%s: %+v, want Exited %d", tc.id, st, tc.code)
		}
		logs, _ := s.Logs(ctx, tc.id, 0)
		if tc.code == 0 && (!strings.Contains(string(logs), "hello from the guest\n") || !strings.Contains(string(logs), "and stderr\n")) {
			t.Fatalf("log %q", logs)
		}
		if last, _ := s.Logs(ctx, tc.id, 1); tc.code == 0 && string(last) != "and stderr\n" {
			t.Fatalf("tail 1: %q", last)
		}
	}
}

const server = `
const port = Number(Deno.env.get("SOCIALWEB_PORT_HTTP"));
Deno.serve({ hostname: "127.0.0.1", port, onListen() { console.log("listening"); } },
  () => new Response("hello " + Deno.env.get("SOCIALWEB_GUEST_ID")));
`

func get(ctx context.Context, port int) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/", port), nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func waitGet(t *testing.T, ctx context.Context, port int) string {
	t.Helper()
	for {
		body, err := get(ctx, port)
		if err == nil {
			return body
		}
		select {
		case <-ctx.Done():
			t.Fatalf("GET 127.0.0.1:%d: %v", port, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestServesForwardedPortThenStops(t *testing.T) {
	s, dir := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	st, err := s.Boot(ctx, substrate.GuestSpec{ID: "web", UserData: []byte(server),
		Ports: []substrate.Port{{Name: "http", Guest: 8080}}})
	if err != nil {
		t.Fatal(err)
	}
	port, ok := st.HostPort("http")
	if !ok || st.Address != "127.0.0.1" {
		t.Fatalf("status %+v", st)
	}
	if body := waitGet(t, ctx, port); body != "hello web" {
		t.Fatalf("body %q", body)
	}
	st, _ = s.Status(ctx, "web")
	if st.Phase != substrate.Running || st.PID == 0 {
		t.Fatalf("status %+v", st)
	}
	if n := len(guestproc.GroupMembers(st.PID, true)); n < 2 {
		t.Fatalf("process group has %d members, want supervisor and deno", n)
	}
	if err := s.Stop(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	st, _ = s.Status(ctx, "web")
	if st.Phase != substrate.Stopped {
		t.Fatalf("after stop: %+v", st)
	}
	if pids := substratetest.Procs(dir); len(pids) != 0 {
		for _, p := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			t.Logf("%s %q", b, c)
		}
		t.Fatalf("processes left: %v", pids)
	}
	if m := guestproc.GroupMembers(mustPID(t, dir, "web"), true); len(m) != 0 {
		t.Fatalf("group members left (zombies included): %v", m)
	}
	if _, err := get(ctx, port); err == nil {
		t.Fatal("port still answers after stop")
	}
	if err := s.Remove(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Status(ctx, "web"); !errors.Is(err, substrate.ErrNotFound) {
		t.Fatalf("status after remove: %v", err)
	}
}

func mustPID(t *testing.T, dir, id string) int {
	var rec guestproc.Record
	if err := guestproc.ReadJSON(filepath.Join(dir, id, guestproc.PidFile), &rec); err != nil {
		t.Fatal(err)
	}
	return rec.PID
}

func TestDeniedNetworkFailsInGuest(t *testing.T) {
	s, _ := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	// A real listener on a port the guest is not granted: the guest must
	// be refused by its permissions, not by the network.
	port, accepted := substratetest.Listener(t)
	denied := port
	prog := fmt.Sprintf(`
const port = Number(Deno.env.get("SOCIALWEB_PORT_HTTP"));
try {
  const c = await Deno.connect({ hostname: "127.0.0.1", port: %d });
  c.close();
  console.log("connected");
} catch (e) {
  console.log("refused: " + e.name);
  Deno.exit(7);
}
`, denied)
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "nonet", UserData: []byte(prog),
		Ports: []substrate.Port{{Name: "http", Guest: 80}}}); err != nil {
		t.Fatal(err)
	}
	st, err := substrate.WaitEnded(ctx, s, "nonet")
	if err != nil {
		t.Fatal(err)
	}
	logs, _ := s.Logs(ctx, "nonet", 0)
	if st.Phase != substrate.Exited || st.ExitCode != 7 || !strings.Contains(string(logs), "refused: NotCapable") {
		t.Fatalf("status %+v log %q", st, logs)
	}
	select {
	case <-accepted:
		t.Fatal("the guest reached a port it was not granted")
	default:
	}
	// Reading the host's files is denied too.
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "noread", UserData: []byte(`
try { Deno.readTextFileSync("/etc/hostname"); console.log("read"); } catch (e) { console.log("refused: " + e.name); Deno.exit(7); }`)}); err != nil {
		t.Fatal(err)
	}
	if st, _ := substrate.WaitEnded(ctx, s, "noread"); st.ExitCode != 7 {
		logs, _ := s.Logs(ctx, "noread", 0)
		t.Fatalf("read of /etc/hostname: %+v %q", st, logs)
	}
}

func TestSecretsReachOnlyTheGuest(t *testing.T) {
	s, dir := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	secret := "s3cret-" + fmt.Sprint(time.Now().UnixNano())
	sum := sha256.Sum256([]byte(secret))
	prog := `
const dir = Deno.env.get("SOCIALWEB_SECRETS_DIR");
const v = Deno.readFileSync(dir + "/token");
const h = new Uint8Array(await crypto.subtle.digest("SHA-256", v));
console.log("sha256 " + Array.from(h).map((b) => b.toString(16).padStart(2, "0")).join(""));
console.log("path " + dir + "/token");
setInterval(() => {}, 1 << 30); // run until stopped
`
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "sec", UserData: []byte(prog),
		Secrets: map[string][]byte{"token": []byte(secret)}}); err != nil {
		t.Fatal(err)
	}
	var logs []byte
	for !strings.Contains(string(logs), "path ") {
		if st, _ := s.Status(ctx, "sec"); st.Phase.Ended() {
			t.Fatalf("guest ended: %+v %q", st, logs)
		}
		time.Sleep(20 * time.Millisecond)
		logs, _ = s.Logs(ctx, "sec", 0)
	}
	if !strings.Contains(string(logs), "sha256 "+hex.EncodeToString(sum[:])) {
		t.Fatalf("guest did not read the secret: %q", logs)
	}
	secPath := filepath.Join(dir, "sec", "secrets", "token")
	fi, err := os.Stat(secPath)
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("secret file %v %v", fi, err)
	}
	// Not on any command line or environment of the guest's processes, not
	// in any state file but the secret itself.
	st, _ := s.Status(ctx, "sec")
	for _, pid := range guestproc.GroupMembers(st.PID, false) {
		for _, f := range []string{"cmdline", "environ"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if strings.Contains(string(b), secret) {
				t.Fatalf("secret in /proc/%d/%s", pid, f)
			}
		}
	}
	filepath.WalkDir(filepath.Join(dir, "sec"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == secPath {
			return nil
		}
		if b, _ := os.ReadFile(p); strings.Contains(string(b), secret) {
			t.Errorf("secret in %s", p)
		}
		return nil
	})
	// Another guest cannot read it.
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "snoop", UserData: []byte(fmt.Sprintf(
		`try { Deno.readTextFileSync(%q); console.log("read"); } catch (e) { console.log("refused: " + e.name); Deno.exit(7); }`, secPath))}); err != nil {
		t.Fatal(err)
	}
	if st, _ := substrate.WaitEnded(ctx, s, "snoop"); st.ExitCode != 7 {
		t.Fatalf("another guest read the secret: %+v", st)
	}
	if err := s.Stop(ctx, "sec"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(secPath); !os.IsNotExist(err) {
		t.Fatalf("secret file left after stop: %v", err)
	}
}

func TestRestartFindsGuests(t *testing.T) {
	s1, dir := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	for _, id := range []string{"keep", "killed"} {
		if _, err := s1.Boot(ctx, substrate.GuestSpec{ID: id, UserData: []byte(server),
			Ports: []substrate.Port{{Name: "http", Guest: 8080}}}); err != nil {
			t.Fatal(err)
		}
	}
	st, _ := s1.Status(ctx, "keep")
	port, _ := st.HostPort("http")
	waitGet(t, ctx, port)
	// The guest's whole group dies behind the substrate's back.
	killed, _ := s1.Status(ctx, "killed")
	syscall.Kill(-killed.PID, syscall.SIGKILL)

	s2, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	gs, err := s2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	phases := map[string]substrate.Phase{}
	for _, g := range gs {
		phases[g.ID] = g.Phase
	}
	if phases["keep"] != substrate.Running || len(gs) != 2 {
		t.Fatalf("new substrate lists %+v", gs)
	}
	if st, _ := substrate.WaitEnded(ctx, s2, "killed"); st.Phase != substrate.Failed {
		t.Fatalf("killed guest: %+v", st)
	}
	for _, id := range []string{"keep", "killed"} {
		if err := s2.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if st, _ := s1.Status(ctx, "keep"); st.Phase != substrate.Stopped {
		t.Fatalf("old value sees %+v", st)
	}
	if pids := substratetest.Procs(dir); len(pids) != 0 {
		for _, p := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			t.Logf("%s %q", b, c)
		}
		t.Fatalf("processes left: %v", pids)
	}
}

func TestErrors(t *testing.T) {
	s, _ := newSub(t)
	ctx := ctxT(t, 30*time.Second)
	for _, spec := range []substrate.GuestSpec{
		{ID: "", UserData: []byte("1")},
		{ID: "../x", UserData: []byte("1")},
		{ID: "a"},
		{ID: "a", UserData: []byte("1"), Ports: []substrate.Port{{Name: "p", Guest: 0}}},
		{ID: "a", UserData: []byte("1"), Permissions: substrate.Permissions{Net: []string{"a,b"}}},
		{ID: "a", UserData: []byte("1"), Secrets: map[string][]byte{"../x": nil}},
	} {
		if _, err := s.Boot(ctx, spec); !errors.Is(err, substrate.ErrInvalidSpec) {
			t.Errorf("%v: err %v", spec, err)
		}
	}
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "dup", UserData: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "dup", UserData: []byte("1")}); !errors.Is(err, substrate.ErrExists) {
		t.Fatalf("second boot: %v", err)
	}
	for _, err := range []error{
		s.Stop(ctx, "nope"),
		func() error { _, err := s.Status(ctx, "nope"); return err }(),
		func() error { _, err := s.Logs(ctx, "nope", 1); return err }(),
	} {
		var se *substrate.Error
		if !errors.Is(err, substrate.ErrNotFound) || !errors.As(err, &se) || se.Kind != Kind {
			t.Errorf("err %v", err)
		}
	}
	if _, err := New(Config{StateDir: t.TempDir(), Deno: "/nonexistent/deno"}); !errors.Is(err, substrate.ErrUnavailable) {
		t.Fatalf("missing binary: %v", err)
	}
}

// BenchmarkBootToFirstOutput: Boot to the guest's first line of output, unjailed (deno's
// flags alone: the baseline) and jailed under each init: the small socialweb-guest-jail (what
// a bidder built by hack/build.sh runs), this test binary, and the socialweb binary at
// $SOCIALWEB_TEST_BIN when set. The sub-benchmarks take turns when run with -count.
func BenchmarkBootToFirstOutput(b *testing.B) {
	if DefaultBinary() == "" {
		b.Skip("no deno")
	}
	cases := []struct {
		name string
		cfg  func(b *testing.B) Config
	}{
		{"unjailed", func(*testing.B) Config { return Config{Unjailed: true} }},
		{"init=" + jail.InitBinary, func(b *testing.B) Config { return Config{Init: smallInit(b)} }},
		{"init=test-binary", func(*testing.B) Config { return Config{} }},
	}
	if bin := os.Getenv("SOCIALWEB_TEST_BIN"); bin != "" {
		cases = append(cases, struct {
			name string
			cfg  func(b *testing.B) Config
		}{"init=socialweb", func(*testing.B) Config { return Config{Init: bin} }})
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			cfg := tc.cfg(b)
			cfg.StateDir = b.TempDir()
			s, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			bootToFirstOutput(b, s)
		})
	}
}

func bootToFirstOutput(b *testing.B, s *Substrate) {
	ctx := context.Background()
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("g%d", i)
		t0 := time.Now()
		if _, err := s.Boot(ctx, substrate.GuestSpec{ID: id, UserData: []byte(`console.log("up"); setInterval(() => {}, 1 << 30);`)}); err != nil {
			b.Fatal(err)
		}
		for {
			l, _ := s.Logs(ctx, id, 0)
			if len(l) > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		total += time.Since(t0)
		if err := s.Stop(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms/first-output")
}

// TestHelperBoot is not a test: TestGuestsOutliveTheirProcess runs the test
// binary with it to boot guests from another OS process that then exits.
func TestHelperBoot(t *testing.T) {
	dir := os.Getenv("SOCIALWEB_TEST_HELPER_STATE")
	if dir == "" {
		t.Skip("helper for TestGuestsOutliveTheirProcess")
	}
	s, err := New(Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "server", UserData: []byte(server),
		Ports: []substrate.Port{{Name: "http", Guest: 8080}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "short", UserData: []byte(
		`await new Promise((r) => setTimeout(r, 1500)); console.log("done"); Deno.exit(9);`)}); err != nil {
		t.Fatal(err)
	}
}

// A bidder restarted mid-flow: the process that booted the guests is gone,
// so their supervisors are nobody's children here. This process still sees
// one serve and the other end with its own status, and stops what runs.
func TestGuestsOutliveTheirProcess(t *testing.T) {
	s, dir := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperBoot$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SOCIALWEB_TEST_HELPER_STATE="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	st, err := s.Status(ctx, "server")
	if err != nil || st.Phase != substrate.Running {
		t.Fatalf("server after its booter exited: %+v %v", st, err)
	}
	if ppid := ppidOf(st.PID); ppid == os.Getpid() {
		t.Fatalf("supervisor is this process's child; the test proves nothing")
	}
	port, _ := st.HostPort("http")
	if body := waitGet(t, ctx, port); body != "hello server" {
		t.Fatalf("body %q", body)
	}
	st, err = substrate.WaitEnded(ctx, s, "short")
	if err != nil || st.Phase != substrate.Exited || st.ExitCode != 9 {
		t.Fatalf("short: %+v %v", st, err)
	}
	if err := s.Stop(ctx, "server"); err != nil {
		t.Fatal(err)
	}
	if pids := substratetest.Procs(dir); len(pids) != 0 {
		t.Fatalf("processes left: %v", pids)
	}
}

func ppidOf(pid int) int {
	st, err := guestproc.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.PPID
}
