package e2e

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// hostRow is one requirement line of `socialweb check-host`.
type hostRow struct{ status, need, detail string }

var hostRowLine = regexp.MustCompile(`^  (HOLDS|MISSING|MUST BE PASSED IN)\s+(needed|optional|unused)\s+(\S(?:\S| \S)*)\s{2,}(.*)$`)

// checkHost runs `socialweb check-host args...` with env (nil: this process's) and returns
// its rows by "area/requirement", its output and its exit code.
func checkHost(t *testing.T, env []string, args ...string) (map[string]hostRow, string, int) {
	t.Helper()
	cmd := exec.Command(socialwebBin, append([]string{"check-host"}, args...)...)
	cmd.Env = env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	code := 0
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("check-host: %v", err)
		}
		code = ee.ExitCode()
	}
	rows := map[string]hostRow{}
	area := ""
	for _, l := range strings.Split(out.String(), "\n") {
		if m := hostRowLine.FindStringSubmatch(l); m != nil {
			rows[area+"/"+m[3]] = hostRow{status: m[1], need: m[2], detail: m[4]}
			continue
		}
		if l != "" && !strings.HasPrefix(l, " ") && !strings.Contains(l, ":") {
			area, _, _ = strings.Cut(l, " (")
		}
	}
	return rows, out.String() + errOut.String(), code
}

// TestCheckHost_ThisMachine: on this machine (hack/install-test-deps.sh ran: root, iproute2,
// util-linux, qemu, containerd, the CNI plugins, deno) what up runs by default holds and
// check-host exits 0; with nothing on PATH the rows name the apt package that installs each
// tool and check-host exits non-zero, naming them.
func TestCheckHost_ThisMachine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the rows of this machine hold as root")
	}
	rows, out, code := checkHost(t, nil)
	for _, k := range []string{"deno guests/root", "deno guests/deno", "deno guests/unshare", "deno guests/cgroups",
		"nodes/root", "nodes/ip", "nodes/nsenter", "nodes/containerd", "nodes//usr/lib/cni/bridge", "nodes/node runtime",
		"vm guests/qemu-system-x86_64", "tenant control planes/advertise address"} {
		if r, ok := rows[k]; !ok || r.status != "HOLDS" {
			t.Errorf("row %s: %+v, want HOLDS\n%s", k, r, out)
		}
	}
	if code != 0 {
		t.Errorf("check-host exited %d on this machine with up's defaults, want 0\n%s", code, out)
	}
	for _, s := range []string{"deno guests: ready", "nodes: ready", "tenant control planes: ready"} {
		if !strings.Contains(out, "\n"+s+"\n") {
			t.Errorf("no summary line %q\n%s", s, out)
		}
	}

	empty := t.TempDir()
	env := []string{"PATH=" + empty, "HOME=" + os.Getenv("HOME")}
	rows, out, code = checkHost(t, env, "--vm-image", t.TempDir(), "--node-flavour", "vm")
	for k, fix := range map[string]string{
		"deno guests/unshare":          "apt-get install -y util-linux",
		"nodes/ip":                     "apt-get install -y iproute2",
		"nodes/containerd":             "apt-get install -y containerd",
		"nodes/runc":                   "apt-get install -y runc",
		"nodes/nft":                    "apt-get install -y nftables",
		"vm guests/qemu-system-x86_64": "apt-get install -y qemu-system-x86",
		"vm nodes/mkfs.ext4":           "apt-get install -y e2fsprogs",
	} {
		r := rows[k]
		if r.status != "MISSING" || r.need != "needed" || !strings.HasSuffix(r.detail, "-> "+fix) {
			t.Errorf("row %s with an empty PATH: %+v, want MISSING needed -> %s\n%s", k, r, fix, out)
		}
	}
	// No apt to build an image with: the image is the operator's to pass in.
	if r := rows["vm guests/vm image"]; r.status != "MUST BE PASSED IN" || !strings.Contains(r.detail, "--vm-image DIR") {
		t.Errorf("row vm image with no apt-get: %+v, want MUST BE PASSED IN --vm-image\n%s", r, out)
	}
	if code == 0 {
		t.Errorf("check-host exited 0 with an empty PATH\n%s", out)
	}
	for _, s := range []string{"vm guests: missing qemu-system-x86_64 (apt-get install -y qemu-system-x86)", "socialweb: this host lacks"} {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q\n%s", s, out)
		}
	}
}

// TestInstallDeps_ThisMachine: on this machine (hack/install-test-deps.sh ran) install-deps for
// a user with an empty HOME finds no Debian package missing, fetches the pinned Deno into
// that user's cache, and exits 0 with every area ready; with nothing on PATH, --dry-run names
// the apt-get command that installs every missing tool of vm nodes, and changes nothing.
func TestInstallDeps_ThisMachine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the rows of this machine hold as root")
	}
	registry, hits := npmRegistry(t)
	home, _, with := freshUser(t, registry)
	cmd := exec.Command(socialwebBin, "install-deps")
	with(cmd)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install-deps: %v\n%s", err, out)
	}
	for _, s := range []string{"== no Debian package missing", "== deno: " + home + "/.cache/socialweb/deno/", "deno guests: ready", "nodes: ready"} {
		if !strings.Contains(string(out), s) {
			t.Errorf("install-deps output lacks %q\n%s", s, out)
		}
	}
	if hits.Load() != 1 {
		t.Errorf("%d requests for the deno package, want 1", hits.Load())
	}

	empty := t.TempDir()
	cmd = exec.Command(socialwebBin, "install-deps", "--dry-run", "--node-flavour", "vm", "--vm-image", t.TempDir())
	cmd.Env = []string{"PATH=" + empty, "HOME=" + home}
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("install-deps --dry-run: %v\n%s", err, out)
	}
	want := "== would run: apt-get update && apt-get install -y containerd e2fsprogs iproute2 iptables nftables qemu-system-x86 runc util-linux\n"
	if !strings.Contains(string(out), want) {
		t.Errorf("install-deps --dry-run with an empty PATH lacks %q\n%s", want, out)
	}
}
