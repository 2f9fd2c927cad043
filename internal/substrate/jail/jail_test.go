package jail

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"socialweb.computer/internal/substrate/substratetest"
)

func TestMain(m *testing.M) {
	MaybeRun()
	os.Exit(m.Run())
}

func TestCgroupFiles(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limits
		v1   map[string]map[string]string
		v2   map[string]string
	}{
		{"none", Limits{}, map[string]map[string]string{"memory": {}, "cpu": {}, "pids": {}}, map[string]string{}},
		{"all", Limits{CPUs: 2, MemMiB: 256, Pids: 64},
			map[string]map[string]string{
				"memory": {"memory.limit_in_bytes": "268435456", "memory.memsw.limit_in_bytes": "268435456", "memory.swappiness": "0"},
				"cpu":    {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": "200000"},
				"pids":   {"pids.max": "64"},
			},
			map[string]string{"memory.max": "268435456", "memory.swap.max": "0", "memory.oom.group": "1", "cpu.max": "200000 100000", "pids.max": "64"}},
		{"pids only", Limits{Pids: 10}, map[string]map[string]string{"memory": {}, "cpu": {}, "pids": {"pids.max": "10"}}, map[string]string{"pids.max": "10"}},
	} {
		if got := V1Files(tc.l); !reflect.DeepEqual(got, tc.v1) {
			t.Errorf("%s v1: %v, want %v", tc.name, got, tc.v1)
		}
		if got := V2Files(tc.l); !reflect.DeepEqual(got, tc.v2) {
			t.Errorf("%s v2: %v, want %v", tc.name, got, tc.v2)
		}
	}
}

func TestOwnCgroup(t *testing.T) {
	const hybrid = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n"
	const unified = "0::/system.slice/socialweb.service\n"
	for _, tc := range []struct{ self, ctrl, want string }{
		{hybrid, "memory", "/process_api/abc"},
		{hybrid, "pids", "/"},
		{hybrid, "cpu", "/x"},
		{hybrid, "", "/"},
		{unified, "", "/system.slice/socialweb.service"},
		{unified, "memory", "/"},
	} {
		if got := ownCgroup(tc.self, tc.ctrl); got != tc.want {
			t.Errorf("ownCgroup(%q, %q) = %q, want %q", tc.self, tc.ctrl, got, tc.want)
		}
	}
}

func TestUIDs(t *testing.T) {
	u := UIDs{Dir: t.TempDir(), Base: 5000, Count: 2}
	a, b := t.TempDir(), t.TempDir()
	ua, err := u.Take(a)
	if err != nil || ua != 5000 {
		t.Fatalf("first: %d %v", ua, err)
	}
	ub, err := u.Take(b)
	if err != nil || ub != 5001 {
		t.Fatalf("second: %d %v", ub, err)
	}
	if _, err := u.Take(t.TempDir()); err == nil {
		t.Fatal("a third uid from a range of two")
	}
	u.Release(ua, b) // not its owner: nothing happens
	if _, err := u.Take(t.TempDir()); err == nil {
		t.Fatal("released by someone else")
	}
	u.Release(ua, a)
	c := t.TempDir()
	if uc, err := u.Take(c); err != nil || uc != 5000 {
		t.Fatalf("after release: %d %v", uc, err)
	}
	// An owner whose dir is gone frees its uid.
	if err := os.RemoveAll(b); err != nil {
		t.Fatal(err)
	}
	if ud, err := u.Take(t.TempDir()); err != nil || ud != 5001 {
		t.Fatalf("stale entry: %d %v", ud, err)
	}
}

// TestJailAloneHidesTheHost runs deno with every Deno permission granted inside a jail: what
// stops it here is the jail alone. It must not see a host file, write one, run a host
// program, keep any privilege, or make a user namespace or ptrace itself through libc.
func TestJailAloneHidesTheHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	deno := findDeno()
	substratetest.Require(t, deno != "", "deno", "run hack/install-deno.sh")
	unshare, err := Unshare()
	if err != nil {
		t.Skip("no unshare")
	}
	host := t.TempDir()
	marker := "jail-marker-" + filepath.Base(host)
	if err := os.WriteFile(filepath.Join(host, "secret.json"), []byte(`{"m":"`+marker+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	guest := t.TempDir()
	work := filepath.Join(guest, "work")
	root := filepath.Join(guest, "root")
	for _, d := range []string{work, root} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	const uid = 1799999999
	if err := os.Chown(work, uid, uid); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(guest, "main.ts")
	if err := os.WriteFile(prog, []byte(`
async function attempt(name, f) {
  try { console.log("ATTEMPT " + name + " ok " + JSON.stringify(await f())); }
  catch (e) { console.log("ATTEMPT " + name + " refused " + e.name); }
}
const dir = Deno.args[0];
await attempt("import-json", async () => (await import(dir + "/secret.json", { with: { type: "json" } })).default);
await attempt("read", () => Deno.readTextFile(dir + "/secret.json"));
await attempt("read-passwd", () => Deno.readTextFile("/etc/passwd"));
await attempt("write", () => Deno.writeTextFile(dir + "/written", "x"));
await attempt("write-root", () => Deno.writeTextFile("/written", "x"));
await attempt("command", async () => (await new Deno.Command("/bin/sh", { args: ["-c", "id"] }).output()).code);
// Raw syscalls through libc (FFI is granted here): the seccomp filter's refusals.
const libc = Deno.dlopen(Deno.args[1], {
  unshare: { parameters: ["i32"], result: "i32" },
  ptrace: { parameters: ["i32", "i32", "pointer", "pointer"], result: "i64" },
  syscall: { parameters: ["i64", "i64"], result: "i64" },
  __errno_location: { parameters: [], result: "pointer" },
});
const errno = () => new Deno.UnsafePointerView(libc.symbols.__errno_location()).getInt32();
// [result, errno]: EPERM (1) is the filter; unshare alone fails with EINVAL (22) in a
// multi-threaded process, so its errno tells which refused it.
await attempt("unshare-user", () => [libc.symbols.unshare(0x10000000), errno()]);
await attempt("ptrace-traceme", () => [Number(libc.symbols.ptrace(0, 0, null, null)), errno()]);
// userfaultfd(UFFD_USER_MODE_ONLY) is open to unprivileged processes (x86_64: syscall 323).
await attempt("userfaultfd", () => [Number(libc.symbols.syscall(323n, 1n)), errno()]);
await attempt("uid", () => Deno.uid());
await attempt("status", async () => (await Deno.readTextFile("/proc/self/status")).split("\n").filter((l) => /^(Uid|Cap(Prm|Eff|Bnd)|NoNewPrivs)/.test(l)).join("; "));
console.log("DONE");
`), 0o644); err != nil {
		t.Fatal(err)
	}
	libs, err := Libraries(deno)
	if err != nil {
		t.Fatal(err)
	}
	ms := []Mount{{Source: deno, Target: "/deno", Exec: true}, {Source: prog, Target: "/main.ts"},
		{Source: work, Target: "/work", Writable: true}, {Source: "/dev/null", Target: "/dev/null", Dev: true, Writable: true}}
	for _, l := range libs {
		ms = append(ms, Mount{Source: l, Target: l, Exec: true})
	}
	libc := ""
	for _, l := range libs {
		if filepath.Base(l) == "libc.so.6" {
			libc = l
		}
	}
	cfg := Config{Root: root, Mounts: ms, UID: uid, GID: uid, Cwd: "/work", Hostname: "guest",
		Argv: []string{"/deno", "run", "--allow-all", "--no-prompt", "/main.ts", host, libc}}
	b, _ := jsonMarshal(cfg)
	cfgPath := filepath.Join(guest, "jail.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	self, _ := os.Executable()
	cmd := exec.Command(unshare, Argv(unshare, self, cfgPath)[1:]...)
	cmd.Env = []string{"HOME=/work", "DENO_DIR=/work/.deno", "NO_COLOR=1"}
	out, err := cmd.CombinedOutput()
	t.Logf("jailed deno --allow-all:\n%s", out)
	if err != nil || !strings.Contains(string(out), "DONE") {
		t.Fatalf("jailed program: %v", err)
	}
	for _, name := range []string{"import-json", "read", "read-passwd", "write", "write-root", "command"} {
		if !strings.Contains(string(out), "ATTEMPT "+name+" refused ") {
			t.Errorf("%s was not refused", name)
		}
	}
	if strings.Contains(string(out), marker) {
		t.Error("the host's marker reached the jailed program")
	}
	if _, err := os.Stat(filepath.Join(host, "written")); err == nil {
		t.Error("the jailed program wrote a host file")
	}
	for _, want := range []string{"ATTEMPT unshare-user ok [-1,1]", "ATTEMPT ptrace-traceme ok [-1,1]", "ATTEMPT userfaultfd ok [-1,1]", "ATTEMPT uid ok 1799999999", "CapPrm:\\t0000000000000000", "CapEff:\\t0000000000000000", "CapBnd:\\t0000000000000000", "NoNewPrivs:\\t1"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("want %q in the output", want)
		}
	}
}

// findDeno is $SOCIALWEB_DENO, else the project's install above the working directory, else
// deno on PATH (the deno substrate's order; that package imports this one).
func findDeno() string {
	if p := os.Getenv("SOCIALWEB_DENO"); p != "" {
		return p
	}
	for dir, _ := os.Getwd(); dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		p := filepath.Join(dir, ".cache/deno/node_modules/@deno/linux-x64-glibc/deno")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("deno")
	return p
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }
