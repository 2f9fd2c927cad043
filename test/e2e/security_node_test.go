package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// probeScript tries a TCP connection to every target host:port (busybox nc, in parallel,
// 3 s each) and prints one line per target, "probe T: ... connected" when it got through.
func probeScript(targets []string) string {
	return `for t in ` + strings.Join(targets, " ") + `; do ( echo "probe $t: $(/bin/busybox nc -w 3 ${t%:*} ${t##*:} </dev/null 2>&1 && echo connected)" ) & done; wait`
}

// probeResults maps each target to its line of probeScript's output.
func probeResults(out string) map[string]string {
	results := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "probe "); ok {
			tgt, r, _ := strings.Cut(rest, ": ")
			results[tgt] = r
		}
	}
	return results
}

// checkProbes fails for every target but control that was reached, and when control (a
// target that listens) was not: then the probe could not tell.
func checkProbes(t *testing.T, out, control string, targets []string) {
	t.Helper()
	results := probeResults(out)
	for _, tgt := range append([]string{control}, targets...) {
		r, ok := results[tgt]
		reached := strings.HasSuffix(r, "connected")
		switch {
		case !ok:
			t.Errorf("%s: no result in\n%s", tgt, out)
		case tgt == control && !reached:
			t.Errorf("the control %s was not reached (%q): the probe cannot tell reached from blocked", tgt, r)
		case tgt != control && reached:
			t.Errorf("reached %s", tgt)
		}
	}
}

// proberPod reports its seccomp mode, listens on 127.0.0.1:7777 (the probe's control),
// probes the targets and sleeps.
func proberPod(name string, targets []string) string {
	script := `while read l; do case "$l" in Seccomp:*) echo "status $l";; esac; done < /proc/self/status
/bin/busybox nc -l -p 7777 </dev/null >/dev/null 2>&1 &
sleep 1
` + probeScript(append([]string{"127.0.0.1:7777"}, targets...)) + `
echo "probes done"; exec sleep 3599`
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", ` + strconv.Quote(script) + `]
`
}

// hostListeningPorts are the TCP ports something on the host listens on (any address).
func hostListeningPorts(t *testing.T) []int {
	t.Helper()
	// This thread's view, not /proc/net (the process's first thread's, which a row that
	// entered a namespace may have left there).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	seen := map[int]bool{}
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) < 4 || fs[3] != "0A" { // LISTEN
				continue
			}
			_, port, _ := strings.Cut(fs[1], ":")
			p, err := strconv.ParseUint(port, 16, 16)
			if err == nil {
				seen[int(p)] = true
			}
		}
	}
	var ports []int
	for p := range seen {
		ports = append(ports, p)
	}
	slices.Sort(ports)
	return ports
}

// portOf is the port of a URL http://127.0.0.1:PORT[/...].
func portOf(t *testing.T, url string) int {
	t.Helper()
	s := strings.TrimPrefix(strings.TrimPrefix(url, "http://"), "https://")
	s, _, _ = strings.Cut(s, "/")
	_, p, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(p)
	if !ok || err != nil {
		t.Fatalf("no port in %q", url)
	}
	return n
}

// nodeProcess is the host PID of the process of guest dir whose command line names the
// guest's dir and holds word as an argument.
func nodeProcess(t *testing.T, guestDir, word string) int {
	t.Helper()
	for _, pid := range procsWithArg(guestDir) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) == word || slices.Contains(args, word) {
			return pid
		}
	}
	t.Fatalf("no %s process of %s", word, guestDir)
	return 0
}

// inNode runs script with /bin/sh inside the mount and PID namespaces of process pid (as
// a process that escaped a container to the node's containerd would) and returns its output.
func inNode(t *testing.T, pid int, script string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(pid), "-m", "-p", "--", "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Logf("in the node: %v", err)
	}
	return string(out)
}

// A pod on a node of the namespace flavour, rented through the market, and a process that
// escaped it to the node's containerd: the host's data dir (the PDS's account, the admin
// token, the bidders' accounts) and a marker outside it are not in the node's root, a write
// there does not reach the host, the host's processes are not in its PID namespace, the
// host's disk cannot be opened even after mknod; the pod runs under seccomp (mode 2); the
// node's cgroup carries the contract's limits and holds the node's containerd, kubelet and
// the pod; and the pod reaches neither the host's listening ports (core API, PDS, gateway,
// bidder, tenant apiservers, whatever listens) nor another cluster's node, while its own
// node's kubelet answers a process of the node (the probe can succeed).
func TestSecurity_NodeContainment(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t, "--node-bid-window", "1s")
	core, pds, gw := n.up.phase(t, "core serving at "), n.up.phase(t, "PDS serving at "), n.up.phase(t, "gateway serving at ")
	marker := filepath.Join(filepath.Dir(n.dir), "host-marker")
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostFiles := []string{
		filepath.Join(n.dir, "pds", "account.json"), filepath.Join(n.dir, "pki", "admin.token"),
		filepath.Join(n.dir, "node-bidder", "account.json"), marker,
	}
	for _, f := range hostFiles {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("host file %s: %v (the check below would prove nothing)", f, err)
		}
	}

	// Another cluster's node, with a pod of its own.
	kcB := n.cluster("other", "maxNodes: 1, scaleHold: 1s")
	tkubectl(t, kcB, strings.Replace(spreadPod("other"), "app: spread", "app: other", 1), "apply", "-f", "-")
	nodeB := waitPod(t, kcB, "other", "Running", "", 120*time.Second)
	ipB, err := tkubectlErr(kcB, "get", "node", nodeB, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
	if err != nil || ipB == "" {
		t.Fatalf("node %s address: %q %v", nodeB, ipB, err)
	}

	// The cluster under test: its first node is rented for the prober; its address and the
	// host end of its veth pair are known once it exists, so the prober is a second pod.
	kc := n.cluster("sec", "maxNodes: 1, scaleHold: 1s")
	tkubectl(t, kc, spreadPod("first"), "apply", "-f", "-")
	nodeA := waitPod(t, kc, "first", "Running", "", 120*time.Second)
	guestA := n.guestOf(nodeA)
	var nsA struct {
		HostIP string `json:"hostIP"`
		NodeIP string `json:"nodeIP"`
	}
	if err := guestproc.ReadJSON(filepath.Join(guestA, "node.json"), &nsA); err != nil {
		t.Fatal(err)
	}
	ports := hostListeningPorts(t)
	for _, u := range []string{core, pds, gw} {
		if !slices.Contains(ports, portOf(t, u)) {
			t.Fatalf("%s not among the host's listening ports %v", u, ports)
		}
	}
	// The host's listening ports at the host end of the node's veth pair (the node's default
	// route), another cluster's node's kubelet, and the same ports on the pod's own loopback.
	// The pod's own node's kubelet is not a target: a pod reaches its node's address, as in
	// every Kubernetes cluster, and the kubelet refuses a caller without the cluster's
	// credentials (anonymous off, webhook authorization).
	targets := []string{ipB + ":10250"}
	for _, p := range ports {
		targets = append(targets, fmt.Sprintf("%s:%d", nsA.HostIP, p), fmt.Sprintf("127.0.0.1:%d", p))
	}
	t.Logf("%d host ports (core %d, PDS %d, gateway %d, the bidder's and the tenant apiservers' among them), %d targets",
		len(ports), portOf(t, core), portOf(t, pds), portOf(t, gw), len(targets))
	tkubectl(t, kc, strings.Replace(proberPod("prober", targets), "spec:\n", "spec:\n  nodeName: "+nodeA+"\n", 1), "apply", "-f", "-")
	waitPod(t, kc, "prober", "Running", nodeA, 60*time.Second)
	var logs string
	testenv.Eventually(t, 60*time.Second, "prober done", func() (bool, error) {
		logs, _ = tkubectlErr(kc, "logs", "prober")
		return strings.Contains(logs, "probes done"), fmt.Errorf("%q", logs)
	})

	t.Run("seccomp", func(t *testing.T) {
		if !strings.Contains(logs, "status Seccomp:\t2") && !strings.Contains(logs, "status Seccomp: 2") {
			t.Errorf("the pod runs without seccomp filter mode (want Seccomp: 2):\n%s", logs)
		}
	})

	t.Run("network from the pod", func(t *testing.T) {
		checkProbes(t, logs, "127.0.0.1:7777", targets)
		r := probeResults(logs)
		t.Logf("core at the host end: %q; another cluster's node: %q", r[fmt.Sprintf("%s:%d", nsA.HostIP, portOf(t, core))], r[ipB+":10250"])
	})

	containerd := nodeProcess(t, guestA, "containerd")
	kubelet := nodeProcess(t, guestA, "kubelet")
	t.Run("network from the node", func(t *testing.T) {
		// A process in the node's own network namespace (hostNetwork, or out of its
		// container): its default route is the host end of the veth pair. The node's own
		// kubelet answers it.
		var hostTargets []string
		for _, p := range ports {
			hostTargets = append(hostTargets, fmt.Sprintf("%s:%d", nsA.HostIP, p))
		}
		hostTargets = append(hostTargets, ipB+":10250")
		out, _ := exec.Command("nsenter", "-t", strconv.Itoa(containerd), "-n", "-m", "-p", "--", "/bin/sh", "-c",
			probeScript(append([]string{nsA.NodeIP + ":10250"}, hostTargets...))).CombinedOutput()
		checkProbes(t, string(out), nsA.NodeIP+":10250", hostTargets)
		r := probeResults(string(out))
		t.Logf("core at the host end: %q; another cluster's node: %q", r[fmt.Sprintf("%s:%d", nsA.HostIP, portOf(t, core))], r[ipB+":10250"])
	})

	t.Run("escape to the node's namespaces", func(t *testing.T) {
		var script strings.Builder
		for _, f := range hostFiles {
			// The words are split in the script: the shell's own command line is in the
			// node's process list below, and must not read as a finding.
			fmt.Fprintf(&script, "test -e %q && echo 'pres''ent %s'; cat /proc/1/root%s 2>/dev/null && echo 're''ad %s'\n", f, f, f, f)
		}
		fmt.Fprintf(&script, "echo escaped > %q 2>/dev/null\n", marker+"-written")
		script.WriteString(`for p in /proc/[0-9]*; do echo "proc ${p#/proc/} $(tr '\0' ' ' < $p/cmdline)"; done` + "\n")
		// The host's root disk, as root with mknod: the node's devices cgroup refuses it.
		var st unix.Stat_t
		if err := unix.Stat("/", &st); err != nil {
			t.Fatal(err)
		}
		disk := unix.Major(st.Dev) != 0
		if disk {
			fmt.Fprintf(&script, "echo \"disk: $(mknod /tmp/swdisk b %d %d 2>&1 && head -c 4096 /tmp/swdisk 2>/dev/null | wc -c)\"; rm -f /tmp/swdisk\n", unix.Major(st.Dev), unix.Minor(st.Dev))
		} else {
			t.Logf("the host's / is on no block device (%d:%d): no disk to try", unix.Major(st.Dev), unix.Minor(st.Dev))
		}
		out := inNode(t, containerd, script.String())
		for _, f := range hostFiles {
			if strings.Contains(out, "present "+f) || strings.Contains(out, "read "+f) {
				t.Errorf("the node sees the host's %s", f)
			}
		}
		if _, err := os.Stat(marker + "-written"); err == nil {
			t.Errorf("the node wrote %s on the host", marker+"-written")
		}
		var procs []string
		for _, l := range strings.Split(out, "\n") {
			if rest, ok := strings.CutPrefix(l, "proc "); ok {
				procs = append(procs, rest)
				if strings.Contains(rest, "--data-dir") || strings.Contains(rest, "e2e.test") || strings.Contains(rest, "socialweb up") {
					t.Errorf("a host process is in the node's PID namespace: %s", rest)
				}
			}
		}
		if len(procs) == 0 {
			t.Errorf("no process listed in the node (the check proves nothing):\n%s", out)
		}
		if got := lineWith(out, "disk: "); strings.HasSuffix(got, "4096") {
			t.Errorf("the node read the host's disk through a device node it made: %s", got)
		}
		t.Logf("the node's processes: %d; %s", len(procs), lineWith(out, "disk: "))
	})

	t.Run("devices", func(t *testing.T) {
		// The host here may itself be refused its disk (a devices cgroup above it), so the
		// read above can pass either way: the node's own devices cgroup must allow no read
		// or write of a block device.
		var dirs []string
		if err := guestproc.ReadJSON(filepath.Join(guestA, "cgroups.json"), &dirs); err != nil {
			t.Fatal(err)
		}
		var list string
		for _, d := range dirs {
			if strings.HasPrefix(d, "/sys/fs/cgroup/devices/") {
				b, err := os.ReadFile(filepath.Join(d, "devices.list"))
				if err != nil {
					t.Fatal(err)
				}
				list = string(b)
			}
		}
		if list == "" {
			t.Fatalf("the node has no devices cgroup (cgroups %v)", dirs)
		}
		for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
			f := strings.Fields(l)
			if len(f) == 3 && (f[0] == "a" || f[0] == "b") && strings.ContainsAny(f[2], "rw") {
				t.Errorf("the node's devices cgroup allows %q", l)
			}
		}
	})

	t.Run("cgroup limits", func(t *testing.T) {
		var dirs []string
		if err := guestproc.ReadJSON(filepath.Join(guestA, "cgroups.json"), &dirs); err != nil {
			t.Fatal(err)
		}
		read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
		var mem, cpu, cpuset, pidsDir, devDir string
		for _, d := range dirs {
			switch {
			case strings.HasPrefix(d, "/sys/fs/cgroup/pids/"):
				pidsDir = d
			case strings.HasPrefix(d, "/sys/fs/cgroup/devices/"):
				devDir = d
			case strings.HasPrefix(d, "/sys/fs/cgroup/memory/"):
				mem = d
			case strings.HasPrefix(d, "/sys/fs/cgroup/cpu/"), strings.HasPrefix(d, "/sys/fs/cgroup/cpu,cpuacct/"):
				cpu = d
			case strings.HasPrefix(d, "/sys/fs/cgroup/cpuset/"):
				cpuset = d
			}
		}
		// The contract of a node is 1 CPU and 256 MiB (computecontract payloadOf); the
		// node's runtime gets 256 MiB on top.
		if got := read(filepath.Join(mem, "memory.limit_in_bytes")); got != strconv.Itoa((256+256)<<20) {
			t.Errorf("%s memory.limit_in_bytes = %q, want %d", mem, got, (256+256)<<20)
		}
		// One CPU is a cpuset of one of the host's CPUs with the shares of one, and no CFS
		// quota: on cgroup v1 that would refuse a pod's limit above it.
		if got := read(filepath.Join(cpuset, "cpuset.cpus")); !isOneCPU(got) {
			t.Errorf("%s cpuset.cpus = %q, want one CPU", cpuset, got)
		}
		if s, q := read(filepath.Join(cpu, "cpu.shares")), read(filepath.Join(cpu, "cpu.cfs_quota_us")); s != "1024" || q != "-1" {
			t.Errorf("%s cpu.shares %s, cpu.cfs_quota_us %s, want 1024 and -1", cpu, s, q)
		}
		sleeper := 0
		for _, pid := range procsWithArg("sleep\x003599") {
			sleeper = pid
		}
		for _, pid := range []int{containerd, kubelet, sleeper} {
			if pid == 0 {
				t.Errorf("the prober's process not found")
				continue
			}
			cg := read(fmt.Sprintf("/proc/%d/cgroup", pid))
			for _, l := range strings.Split(cg, "\n") {
				if strings.Contains(l, ":memory:") || strings.Contains(l, ":cpu:") || strings.Contains(l, ":cpu,cpuacct:") || strings.Contains(l, ":cpuset:") {
					if !strings.Contains(l, filepath.Base(mem)) {
						t.Errorf("process %d is outside the node's cgroup: %s", pid, l)
					}
				}
			}
		}

		// Root of the node (a process escaped to its containerd) lifts the limits through
		// the node's own cgroup mounts: every CPU of the host, 8 GiB, every device, no
		// process cap. The limits the kernel holds the node to must not move.
		hostCPUs := read("/sys/fs/cgroup/cpuset/cpuset.cpus")
		out := inNode(t, containerd, `cd /sys/fs/cgroup || exit 1
for w in "cpuset/cpuset.cpus `+hostCPUs+`" "memory/memory.limit_in_bytes 8589934592" "devices/devices.allow a" "pids/pids.max max"; do
  set -- $w; if echo "$2" > "$1" 2>/dev/null; then echo "wrote $1"; else echo "refused $1"; fi
done`)
		t.Logf("lifting the node's limits from inside it: %s", strings.Join(strings.Fields(out), " "))
		if !strings.Contains(out, "cpuset.cpus") {
			t.Fatalf("the attack did not run: %q", out)
		}
		if got := read(filepath.Join(mem, "memory.limit_in_bytes")); got != strconv.Itoa((256+256)<<20) {
			t.Errorf("the node raised its memory limit to %s", got)
		}
		if got := read(filepath.Join(cpuset, "cpuset.cpus")); !isOneCPU(got) {
			t.Errorf("the node widened its cpuset to %q", got)
		}
		for _, d := range []string{cpuset, filepath.Join(cpuset, "node")} {
			if got := read(filepath.Join(d, "cpuset.effective_cpus")); !isOneCPU(got) {
				t.Errorf("%s runs on CPUs %q", d, got)
			}
		}
		if got := read(filepath.Join(pidsDir, "pids.max")); got != "4096" {
			t.Errorf("the node lifted its pids cap: pids.max %s", got)
		}
		for _, d := range []string{devDir, filepath.Join(devDir, "node")} {
			for _, l := range strings.Split(read(filepath.Join(d, "devices.list")), "\n") {
				if f := strings.Fields(l); len(f) == 3 && (f[0] == "a" || f[0] == "b") && strings.ContainsAny(f[2], "rw") {
					t.Errorf("after the attack %s allows %q", d, l)
				}
			}
		}
	})
}

// isOneCPU: a cpuset.cpus list names a single CPU.
func isOneCPU(list string) bool {
	_, err := strconv.Atoi(list)
	return err == nil
}

// lineWith is the first line of out that starts with prefix.
func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
