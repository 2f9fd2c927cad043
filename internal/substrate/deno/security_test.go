package deno

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/substratetest"
)

// hostMarker puts files holding a fresh marker in a temp dir of the host (outside every state
// dir): a JSON file, a JS module, a text file. It returns the dir and the marker.
func hostMarker(t *testing.T) (string, string) {
	t.Helper()
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	marker := "host-marker-" + hex.EncodeToString(b)
	dir := t.TempDir()
	for name, body := range map[string]string{
		"secret.json": fmt.Sprintf(`{"marker": %q}`, marker),
		"secret.js":   fmt.Sprintf(`export const marker = %q;`, marker),
		"secret.txt":  marker,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, marker
}

// Attacks is a guest that tries every way out Deno offers and prints one line per attempt:
// "ATTEMPT <name> ok <what it got>" or "ATTEMPT <name> refused <error>".
const attacks = `
const dir = %[1]q, port = %[2]d, hostVar = %[3]q;
async function attempt(name, f) {
  try { console.log("ATTEMPT " + name + " ok " + JSON.stringify(await f())); }
  catch (e) { console.log("ATTEMPT " + name + " refused " + e.name + ": " + e.message); }
}
// Literal specifiers: Deno loads those with the module graph, before any permission check.
await attempt("import-json", async () => (await import(%[4]q, { with: { type: "json" } })).default);
await attempt("import-js", async () => (await import(%[5]q)).marker);
await attempt("import-json-url", async () => (await import(%[6]q, { with: { type: "json" } })).default);
// Computed specifiers go through the permission check at run time.
await attempt("import-json-computed", async () => (await import(dir + "/secret.json", { with: { type: "json" } })).default);
await attempt("import-passwd", async () => (await import("/etc/passwd", { with: { type: "text" } })).default);
await attempt("read", () => Deno.readTextFile(dir + "/secret.txt"));
await attempt("read-proc-root", () => Deno.readTextFile("/proc/1/root" + dir + "/secret.txt"));
await attempt("write", () => Deno.writeTextFile(dir + "/written-by-guest", "x"));
await attempt("command", async () => new TextDecoder().decode((await new Deno.Command("/bin/cat", { args: [dir + "/secret.txt"] }).output()).stdout));
await attempt("dlopen", () => Deno.dlopen("/lib/x86_64-linux-gnu/libc.so.6", { getpid: { parameters: [], result: "i32" } }).symbols.getpid());
await attempt("env", () => Deno.env.get(hostVar));
await attempt("env-all", () => Deno.env.toObject());
await attempt("connect", async () => { const c = await Deno.connect({ hostname: "127.0.0.1", port }); c.close(); return "connected"; });
console.log("ATTEMPTS DONE");
`

// TestGuestCannotReachTheHost: a guest tries dynamic JSON and JS imports of a host file, reads,
// writes, a subprocess, FFI, the host's environment and a host loopback port. Each must fail,
// the marker must never reach the guest's output, and its write must not land.
// It runs under both inits: this test binary (as socialweb is its own) and the small
// socialweb-guest-jail that hack/build.sh puts beside socialweb.
func TestGuestCannotReachTheHost(t *testing.T) {
	t.Run("init=self", func(t *testing.T) {
		s, _ := newSub(t)
		attackTheHost(t, s)
	})
	t.Run("init="+jail.InitBinary, func(t *testing.T) {
		init := smallInit(t)
		s, _ := newSubWith(t, Config{Init: init})
		// The guest's PID 1, deno's parent, is that binary.
		ctx := ctxT(t, 30*time.Second)
		if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "idle", UserData: []byte(`setInterval(() => {}, 1 << 30);`)}); err != nil {
			t.Fatal(err)
		}
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppidOf(denoProc(t, s, "idle")))); exe != init {
			t.Fatalf("the guest's init runs %q, want %s", exe, init)
		}
		attackTheHost(t, s)
	})
}

// smallInit builds cmd/socialweb-guest-jail as hack/build.sh does.
func smallInit(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	substratetest.Require(t, err == nil, "go", "the Go toolchain builds the small jail init")
	out := filepath.Join(t.TempDir(), jail.InitBinary)
	cmd := exec.Command(goBin, "build", "-o", out, "socialweb.computer/cmd/socialweb-guest-jail")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", jail.InitBinary, err, b)
	}
	return out
}

func attackTheHost(t *testing.T, s *Substrate) {
	ctx := ctxT(t, 60*time.Second)
	dir, marker := hostMarker(t)
	const hostVar = "SOCIALWEB_TEST_HOST_SECRET"
	t.Setenv(hostVar, marker)
	port, accepted := substratetest.Listener(t)
	prog := fmt.Sprintf(attacks, dir, port, hostVar,
		dir+"/secret.json", dir+"/secret.js", "file://"+dir+"/secret.json")
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "attacker", UserData: []byte(prog)}); err != nil {
		t.Fatal(err)
	}
	if _, err := substrate.WaitEnded(ctx, s, "attacker"); err != nil {
		t.Fatal(err)
	}
	logs, _ := s.Logs(ctx, "attacker", 0)
	if !strings.Contains(string(logs), "ATTEMPTS DONE") {
		t.Fatalf("the guest did not get through its attempts: %s", logs)
	}
	for _, name := range []string{"import-json", "import-js", "import-json-url", "import-json-computed", "import-passwd", "read", "read-proc-root", "write", "command", "dlopen", "env", "env-all", "connect"} {
		if !strings.Contains(string(logs), "ATTEMPT "+name+" refused ") {
			t.Errorf("attempt %s was not refused", name)
		}
	}
	if strings.Contains(string(logs), marker) {
		t.Errorf("the host's marker reached the guest")
	}
	if _, err := os.Stat(filepath.Join(dir, "written-by-guest")); err == nil {
		t.Errorf("the guest wrote a file on the host")
	}
	select {
	case <-accepted:
		t.Errorf("the guest connected to a host loopback port")
	default:
	}
	t.Logf("guest log:\n%s", logs)
}

// TestGuestStaticImportsOfHostFiles: a static import of a host JSON file or JS module fails the
// whole module, so each is a guest of its own; none may print the marker.
func TestGuestStaticImportsOfHostFiles(t *testing.T) {
	s, _ := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	dir, marker := hostMarker(t)
	for id, prog := range map[string]string{
		"static-json": fmt.Sprintf(`import x from %q with { type: "json" }; console.log("GOT " + JSON.stringify(x));`, dir+"/secret.json"),
		"static-js":   fmt.Sprintf(`import { marker } from %q; console.log("GOT " + marker);`, dir+"/secret.js"),
		"static-url":  fmt.Sprintf(`import x from %q with { type: "json" }; console.log("GOT " + JSON.stringify(x));`, "file://"+dir+"/secret.json"),
	} {
		if _, err := s.Boot(ctx, substrate.GuestSpec{ID: id, UserData: []byte(prog)}); err != nil {
			t.Fatal(err)
		}
		st, err := substrate.WaitEnded(ctx, s, id)
		if err != nil {
			t.Fatal(err)
		}
		logs, _ := s.Logs(ctx, id, 0)
		if st.Phase != substrate.Exited || st.ExitCode == 0 || strings.Contains(string(logs), "GOT ") || strings.Contains(string(logs), marker) {
			t.Errorf("%s: %+v, log:\n%s", id, st, logs)
		}
	}
}

// deno finds the deno process of a running guest: the member of the supervisor's process
// group that runs the deno binary.
func denoProc(t *testing.T, s *Substrate, id string) int {
	t.Helper()
	st, err := s.Status(context.Background(), id)
	if err != nil || st.Phase != substrate.Running {
		t.Fatalf("status %+v %v", st, err)
	}
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, pid := range guestproc.GroupMembers(st.PID, false) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == s.Binary() {
				return pid
			}
		}
	}
	t.Fatalf("no deno process in group %d", st.PID)
	return 0
}

// statusField reads a field of /proc/PID/status.
func statusField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return ""
}

// TestGuestIsJailed looks at a running guest from the host: not root, no capability in any
// set, no_new_privs, namespaces of its own, a root that shows none of the host's files, and
// the contract's limits on its cgroups.
func TestGuestIsJailed(t *testing.T) {
	s, dir := newSub(t)
	ctx := ctxT(t, 60*time.Second)
	markerDir, _ := hostMarker(t)
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "jailed", CPUs: 1, MemMiB: 200,
		UserData: []byte(`console.log("up"); setInterval(() => {}, 1 << 30);`)}); err != nil {
		t.Fatal(err)
	}
	pid := denoProc(t, s, "jailed")
	for _, f := range []string{"Uid", "Gid"} {
		for _, id := range strings.Fields(statusField(t, pid, f)) {
			if n, _ := strconv.Atoi(id); n < 1000 {
				t.Errorf("%s %s: want an unprivileged id of the guest's own", f, statusField(t, pid, f))
			}
		}
	}
	if g := statusField(t, pid, "Groups"); g != "" {
		t.Errorf("supplementary groups %q", g)
	}
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := statusField(t, pid, f); v != "0000000000000000" {
			t.Errorf("%s %s: want no capabilities", f, v)
		}
	}
	if v := statusField(t, pid, "NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs %s", v)
	}
	for _, ns := range []string{"mnt", "pid", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if mine == "" || its == mine {
			t.Errorf("%s namespace %q is the host's %q", ns, its, mine)
		}
	}
	// Its root, seen from the host: none of the host's files, only what it was given.
	root := fmt.Sprintf("/proc/%d/root", pid)
	for _, p := range []string{markerDir, "/etc", "/root", "/bin/sh", filepath.Join(dir, "jailed", guestFile), filepath.Join(dir, "jailed", guestproc.PidFile)} {
		if _, err := os.Stat(root + p); err == nil {
			t.Errorf("%s is in the guest's view", p)
		}
	}
	for _, p := range []string{s.Binary(), filepath.Join(dir, "jailed", programFile), "/proc/1/status", "/dev/null"} {
		if _, err := os.Stat(root + p); err != nil {
			t.Errorf("%s is not in the guest's view: %v", p, err)
		}
	}
	// Its processes, seen through its own /proc: the init and deno's own.
	ents, _ := os.ReadDir(root + "/proc")
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	if len(pids) == 0 || len(pids) > 3 {
		t.Errorf("the guest's /proc lists %v", pids)
	}
	var gs guestState
	if err := guestproc.ReadJSON(filepath.Join(dir, "jailed", guestFile), &gs); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"memory.limit_in_bytes": strconv.Itoa(200 << 20), "cpu.cfs_quota_us": "100000", "pids.max": "256",
		"memory.max": strconv.Itoa(200 << 20), "cpu.max": "100000 100000"}
	seen := 0
	for _, d := range gs.Cgroups {
		procs, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if !strings.Contains(" "+strings.Join(strings.Fields(string(procs)), " ")+" ", " "+strconv.Itoa(pid)+" ") {
			t.Errorf("deno (%d) is not in %s (%q)", pid, d, procs)
		}
		for f, v := range want {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				seen++
				if strings.TrimSpace(string(b)) != v {
					t.Errorf("%s/%s = %q, want %q", d, f, strings.TrimSpace(string(b)), v)
				}
			}
		}
	}
	if seen < 3 {
		t.Errorf("only %d of the limits found in %v", seen, gs.Cgroups)
	}
	if err := s.Stop(ctx, "jailed"); err != nil {
		t.Fatal(err)
	}
	for _, d := range gs.Cgroups {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left after stop", d)
		}
	}
}

// TestGuestPastItsMemoryIsKilled: a guest that keeps allocating memory outside the V8 heap
// (which --max-old-space-size does not bound) is killed at its cgroup's limit; the substrate
// says why and boots the next guest as before.
func TestGuestPastItsMemoryIsKilled(t *testing.T) {
	s, _ := newSub(t)
	ctx := ctxT(t, 90*time.Second)
	prog := `
const keep = [];
for (let i = 0; ; i++) {
  const b = new Uint8Array(16 << 20);
  b.fill(1);
  keep.push(b);
  console.log("allocated " + (i + 1) * 16 + " MiB");
}
`
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "hog", MemMiB: 128, UserData: []byte(prog)}); err != nil {
		t.Fatal(err)
	}
	st, err := substrate.WaitEnded(ctx, s, "hog")
	if err != nil {
		t.Fatal(err)
	}
	logs, _ := s.Logs(ctx, "hog", 3)
	if st.Phase != substrate.Exited || st.ExitCode != 137 || !strings.Contains(st.Message, "memory limit of 128 MiB") {
		t.Fatalf("hog: %+v, log tail %q", st, logs)
	}
	if strings.Contains(string(logs), "allocated 256 MiB") {
		t.Fatalf("the guest got past its limit: %q", logs)
	}
	// A bidder stops an ended guest (its cgroups go) and reads its status after.
	if err := s.Stop(ctx, "hog"); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Status(ctx, "hog"); !strings.Contains(st.Message, "memory limit of 128 MiB") {
		t.Fatalf("after stop: %+v", st)
	}
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "after", UserData: []byte(`console.log("fine");`)}); err != nil {
		t.Fatal(err)
	}
	if st, err := substrate.WaitEnded(ctx, s, "after"); err != nil || st.ExitCode != 0 {
		t.Fatalf("the next guest: %+v %v", st, err)
	}
}

// TestUnjailedBaselineReadsTheHost: the attack of TestGuestStaticImportsOfHostFiles is real.
// Under deno's permission flags alone (Config.Unjailed, the containment benchmark's
// baseline) a static import of a host JSON file prints the marker, so the jailed rows'
// refusals are the jail's doing.
func TestUnjailedBaselineReadsTheHost(t *testing.T) {
	s, _ := newSubWith(t, Config{Unjailed: true})
	ctx := ctxT(t, 60*time.Second)
	dir, marker := hostMarker(t)
	prog := fmt.Sprintf(`import x from %q with { type: "json" }; console.log("GOT " + JSON.stringify(x));`, dir+"/secret.json")
	if _, err := s.Boot(ctx, substrate.GuestSpec{ID: "baseline", UserData: []byte(prog)}); err != nil {
		t.Fatal(err)
	}
	if _, err := substrate.WaitEnded(ctx, s, "baseline"); err != nil {
		t.Fatal(err)
	}
	if logs, _ := s.Logs(ctx, "baseline", 0); !strings.Contains(string(logs), marker) {
		t.Fatalf("unjailed, the static import did not read the host file: %s", logs)
	}
}
