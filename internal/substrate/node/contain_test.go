package node

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"socialweb.computer/internal/substrate/guestproc"
)

func TestNodeLimits(t *testing.T) {
	v1 := cpuHost{V1: true, CPUs: []int{0, 1}}
	for _, tc := range []struct {
		name        string
		contained   bool
		cpus, mem   int
		want        cgroupLimits
		wantMemFile string
	}{
		{"uncontained: none", false, 2, 512, cgroupLimits{}, ""},
		{"contract figures", true, 1, 256, cgroupLimits{CPUSet: "1", CPUShares: 1024, MemBytes: 512 << 20, PidsMax: nodePidsMax, Devices: true}, "536870912"},
		{"two cpus: the host's", true, 2, 0, cgroupLimits{CPUShares: 2048, PidsMax: nodePidsMax, Devices: true}, ""},
		{"no figures: processes and devices only", true, 0, 0, cgroupLimits{PidsMax: nodePidsMax, Devices: true}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := nodeLimits(tc.contained, tc.cpus, tc.mem, 1, v1)
			if !reflect.DeepEqual(l, tc.want) {
				t.Fatalf("nodeLimits = %+v, want %+v", l, tc.want)
			}
			var mem string
			for _, w := range limitFiles("memory", l) {
				if w[0] == "memory.limit_in_bytes" {
					mem = w[1]
				}
			}
			if mem != tc.wantMemFile {
				t.Errorf("memory.limit_in_bytes %q, want %q", mem, tc.wantMemFile)
			}
		})
	}
}

// The CPU bound of a node: a machine of the contract's CPUs, never a CFS quota on cgroup
// v1 (where the kernel then refuses any container limit above the contract).
func TestNodeLimitsCPU(t *testing.T) {
	four := []int{0, 1, 2, 3}
	for _, tc := range []struct {
		name         string
		cpus, index  int
		host         cpuHost
		set          string
		shares       int64
		quota        int64
		quotaFileOut string // cpu.cfs_quota_us written on the v1 cpu hierarchy ("": none)
	}{
		{"v1, one of two, index 1", 1, 1, cpuHost{V1: true, CPUs: []int{0, 1}}, "1", 1024, 0, "-1"},
		{"v1, one of two, index 2", 1, 2, cpuHost{V1: true, CPUs: []int{0, 1}}, "0", 1024, 0, "-1"},
		{"v1, the other node's cpu is avoided", 1, 1, cpuHost{V1: true, CPUs: []int{0, 1}, Bound: map[int]int{1: 1}}, "0", 1024, 0, "-1"},
		{"v1, the least bound", 2, 0, cpuHost{V1: true, CPUs: four, Bound: map[int]int{0: 2, 1: 1, 3: 1}}, "1-2", 2048, 0, "-1"},
		{"v1, ties from the index, wrapping", 2, 3, cpuHost{V1: true, CPUs: four}, "0,3", 2048, 0, "-1"},
		{"v1, a parent cpuset of its own", 1, 0, cpuHost{V1: true, CPUs: []int{4, 6}}, "4", 1024, 0, "-1"},
		{"v1, every host cpu: no cpuset", 2, 1, cpuHost{V1: true, CPUs: []int{0, 1}}, "", 2048, 0, "-1"},
		{"v1, more than the host: all of it", 8, 1, cpuHost{V1: true, CPUs: []int{0, 1}}, "", 8192, 0, "-1"},
		{"v1, shares capped", 1024, 1, cpuHost{V1: true, CPUs: []int{0, 1}}, "", cpuSharesMax, 0, "-1"},
		{"v1 without a cpuset hierarchy: the quota", 1, 1, cpuHost{V1: true}, "", 0, 100000, "100000"},
		{"v2: the quota (the kernel takes the smaller)", 1, 1, cpuHost{CPUs: []int{0, 1}}, "", 0, 100000, "100000"},
		{"no contract cpus", 0, 1, cpuHost{V1: true, CPUs: []int{0, 1}}, "", 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := nodeLimits(true, tc.cpus, 0, tc.index, tc.host)
			if l.CPUSet != tc.set || l.CPUShares != tc.shares || l.CPUQuotaUs != tc.quota {
				t.Fatalf("cpuset %q shares %d quota %d, want %q %d %d", l.CPUSet, l.CPUShares, l.CPUQuotaUs, tc.set, tc.shares, tc.quota)
			}
			var quotaFile string
			for _, w := range limitFiles("cpu", l) {
				if w[0] == "cpu.cfs_quota_us" {
					quotaFile = w[1]
				}
			}
			if quotaFile != tc.quotaFileOut {
				t.Errorf("cpu.cfs_quota_us %q, want %q", quotaFile, tc.quotaFileOut)
			}
			var setFile string
			for _, w := range limitFiles("cpuset", l) {
				if w[0] == "cpuset.cpus" {
					setFile = w[1]
				}
			}
			if setFile != tc.set {
				t.Errorf("cpuset.cpus %q, want %q", setFile, tc.set)
			}
			if tc.set != "" {
				// The node is held to exactly its contract's CPUs, on CPUs its parent has.
				cpus, err := parseCPUList(tc.set)
				if err != nil || len(cpus) != tc.cpus {
					t.Errorf("cpuset %q holds %d cpus (%v), want %d", tc.set, len(cpus), err, tc.cpus)
				}
				for _, c := range cpus {
					if !slices.Contains(tc.host.CPUs, c) {
						t.Errorf("cpu %d is not the parent's %v", c, tc.host.CPUs)
					}
				}
			}
		})
	}
}

func TestCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		out  string
	}{
		{"0-1\n", []int{0, 1}, "0-1"},
		{"0", []int{0}, "0"},
		{"0-3,8,10-11", []int{0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"},
		{"4,2,3", []int{2, 3, 4}, "2-4"},
		{"", nil, ""},
	} {
		got, err := parseCPUList(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v %v, want %v", tc.in, got, err, tc.want)
		}
		if s := formatCPUList(got); s != tc.out {
			t.Errorf("formatCPUList(%v) = %q, want %q", got, s, tc.out)
		}
	}
	for _, bad := range []string{"a", "3-1", "1-", "-1"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q): no error", bad)
		}
	}
}

func TestLimitFiles(t *testing.T) {
	l := cgroupLimits{CPUQuotaUs: 150000, MemBytes: 1 << 30, PidsMax: 10, Devices: true}
	for _, tc := range []struct {
		hierarchy string
		want      [][2]string
	}{
		{"cpu", [][2]string{{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", "150000"}}},
		{"cpu,cpuacct", [][2]string{{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", "150000"}}},
		{"cpuacct", nil},
		{"cpuset", nil},
		{"pids", [][2]string{{"pids.max", "10"}}},
		{"", [][2]string{{"cpu.max", "150000 100000"}, {"memory.max", "1073741824"}, {"pids.max", "10"}}},
		{"unified-v2", nil},
	} {
		if got := limitFiles(tc.hierarchy, l); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, want %v", tc.hierarchy, got, tc.want)
		}
	}
	set := cgroupLimits{CPUSet: "1", CPUShares: 1024}
	if got, want := limitFiles("cpu", set), [][2]string{{"cpu.shares", "1024"}, {"cpu.cfs_quota_us", "-1"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("cpu of a cpuset bound: %v, want %v", got, want)
	}
	if got, want := limitFiles("cpuset", set), [][2]string{{"cpuset.cpus", "1"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("cpuset: %v, want %v", got, want)
	}
	dev := limitFiles("devices", l)
	if len(dev) < 2 || dev[0] != [2]string{"devices.deny", "a"} {
		t.Fatalf("devices: %v, want deny a first", dev)
	}
	for _, w := range dev[1:] {
		if w[1][0] == 'b' && w[1] != "b *:* m" {
			t.Errorf("a block device may be read or written: %v", w)
		}
	}
}

const hybridMountinfo = `25 1 0:23 / / rw,relatime - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/memory rw,nosuid,relatime - cgroup cgroup rw,memory
34 30 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
36 30 0:32 / /sys/fs/cgroup/net_cls,net_prio rw,relatime - cgroup cgroup rw,net_cls,net_prio,release_agent=/x
37 25 0:33 / /sys/fs/cgroup/memory/x rw,relatime - cgroup cgroup rw,memory
`

func TestParseCgroupMounts(t *testing.T) {
	got := parseCgroupMounts(hybridMountinfo)
	want := []cgroupMount{
		{"cpu", "cgroup", "cpu"}, {"cpuacct", "cgroup", "cpuacct"}, {"memory", "cgroup", "memory"},
		{"systemd", "cgroup", "xattr,name=systemd"}, {"unified", "cgroup2", ""}, {"net_cls,net_prio", "cgroup", "net_cls,net_prio"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if links := cgroupLinks(got); !reflect.DeepEqual(links, map[string]string{"net_cls": "net_cls,net_prio", "net_prio": "net_cls,net_prio"}) {
		t.Errorf("links %v", links)
	}
	for _, tc := range []struct{ id, controllers, want string }{
		{"1", "cpu", "cpu"}, {"9", "name=systemd", "systemd"}, {"3", "net_prio,net_cls", "net_cls,net_prio"}, {"0", "", "unified"},
	} {
		if d, ok := hierarchyDir(got, tc.id, tc.controllers); !ok || d != tc.want {
			t.Errorf("hierarchyDir(%s:%s) = %q %v, want %q", tc.id, tc.controllers, d, ok, tc.want)
		}
	}
	if d, ok := hierarchyDir(got, "4", "pids"); ok {
		t.Errorf("pids has no mount here, got %q", d)
	}
}

func TestWithoutCaps(t *testing.T) {
	argv := enterArgv(42, []string{"containerd", "--config", "c"})
	if argv[0] != "setpriv" || argv[1] != "--bounding-set" || argv[3] != "--" || argv[4] != "nsenter" {
		t.Fatalf("argv %v", argv)
	}
	for _, c := range []string{"-sys_module", "-dac_read_search", "-sys_rawio"} {
		if !contains(argv[2], c) {
			t.Errorf("bounding set %q keeps %s", argv[2], c)
		}
	}
	if got := argv[len(argv)-3:]; !reflect.DeepEqual(got, []string{"containerd", "--config", "c"}) {
		t.Errorf("tail %v", got)
	}
}

func contains(list, item string) bool {
	for i := 0; i+len(item) <= len(list); i++ {
		if list[i:i+len(item)] == item && (i+len(item) == len(list) || list[i+len(item)] == ',') {
			return true
		}
	}
	return false
}

// rootChildEnv, set, makes the test binary process 1 of a node root (TestRootHidesTheHost).
const rootChildEnv = "SOCIALWEB_TEST_NODE_ROOT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(rootChildEnv); dir != "" {
		os.Exit(RunRoot(dir))
	}
	if dir := os.Getenv(diskAgentEnv); dir != "" {
		os.Exit(runDiskAgent(dir))
	}
	os.Exit(m.Run())
}

// A node's root, built by its process 1 in new mount and PID namespaces: the binaries are
// there read-only, the node's dir read-write, the host's other files (a marker beside the
// node's dir) and processes are not; /proc/sys refuses writes but shows the kubelet's kernel
// settings; the cgroup hierarchies are mounted. Root only.
func TestRootHidesTheHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	base := t.TempDir()
	dir := filepath.Join(base, "guest")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(base, "host-marker")
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ns := nodeState{NodeName: "root-test", Dir: dir, RunDir: filepath.Join("/run/swnode", "t"+strconv.Itoa(os.Getpid())), Binary: exe}
	var cache rootFilesCache
	rf, err := cache.get(exe, ns.Runtime)
	if err != nil {
		t.Fatal(err)
	}
	ns.Root = &rf
	if err := os.MkdirAll(ns.RunDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(ns.RunDir) })
	if err := guestproc.WriteJSON(filepath.Join(dir, nodeFile), ns); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), rootChildEnv+"="+dir)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP,
		Pdeathsig:  syscall.SIGKILL,
	}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for {
		if _, err := os.Stat(filepath.Join(ns.RunDir, rootReadyFile)); err == nil {
			break
		}
		if time.Since(t0) > 15*time.Second {
			t.Fatalf("root not ready: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("root ready in %s", time.Since(t0).Round(time.Millisecond))
	sh := func(script string) string {
		b, _ := exec.Command("nsenter", "-t", strconv.Itoa(cmd.Process.Pid), "-m", "-p", "-u", "--", "/bin/sh", "-c", script).CombinedOutput()
		return strings.TrimSpace(string(b))
	}
	for _, tc := range []struct{ script, want string }{
		{"test -e " + marker + " && echo visible || echo absent", "absent"},
		{"test -e /work || test -e /root/go && echo visible || echo absent", "absent"},
		{"echo x > " + marker + " && echo wrote || echo refused", "wrote"}, // into the node's tmpfs
		{"echo ok > " + dir + "/w && cat " + dir + "/w", "ok"},
		{"test -x " + exe + " && echo x", "x"},
		{"touch " + exe + " 2>/dev/null && echo wrote || echo refused", "refused"},
		{"{ echo '|/bin/true' > /proc/sys/kernel/core_pattern; } 2>/dev/null && echo wrote || echo refused", "refused"},
		{"cat /proc/sys/vm/overcommit_memory", "1"},
		{"stat -c %t,%T /proc/kallsyms", "1,3"}, // /dev/null
		{"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c 'HidesThe[H]ost'", "0"},
		{"cat /proc/1/cmdline | tr '\\0' ' '", exe + " -test.run=^$"},
		{"hostname", "root-test"},
		{"test -f /sys/fs/cgroup/memory/memory.limit_in_bytes -o -f /sys/fs/cgroup/cgroup.controllers && echo cgroups", "cgroups"},
		{"test -e /dev/vda -o -e /dev/sda && echo disk || echo none", "none"},
	} {
		if got := sh(tc.script); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.script, got, tc.want)
		}
	}
	if b, _ := os.ReadFile(marker); string(b) != "host" {
		t.Errorf("the host's marker changed: %q", b)
	}
}

// The root's files are resolved (ldd on each, busybox's applet list) once per set of top
// files: a second boot reuses them, and a changed binary resolves them again.
func TestRootFilesCache(t *testing.T) {
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	bin := filepath.Join(t.TempDir(), "socialweb")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var c rootFilesCache
	first, err := c.get(bin, nodeRuntime{})
	if err != nil {
		t.Fatal(err)
	}
	if first.Files[0][0] != bin || len(first.Applets) == 0 {
		t.Fatalf("files start %v, %d applets: want the binary first and busybox's applets", first.Files[0], len(first.Applets))
	}
	top, err := rootTopFiles(bin, nodeRuntime{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := withSharedLibs(top)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first.Files, want) {
		t.Fatalf("cached files differ from a fresh resolution:\n%v\n%v", first.Files, want)
	}
	key := c.key
	c.val.Applets = []string{"/marker"} // what a second get returns if it does not resolve again
	again, err := c.get(bin, nodeRuntime{})
	if err != nil {
		t.Fatal(err)
	}
	if c.key != key || !slices.Equal(again.Applets, []string{"/marker"}) {
		t.Fatalf("second get resolved again (key %s -> %s)", key, c.key)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(bin, later, later); err != nil {
		t.Fatal(err)
	}
	changed, err := c.get(bin, nodeRuntime{})
	if err != nil {
		t.Fatal(err)
	}
	if c.key == key || slices.Equal(changed.Applets, []string{"/marker"}) {
		t.Fatal("a changed binary kept the old resolution")
	}
}
