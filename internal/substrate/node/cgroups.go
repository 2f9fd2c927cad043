package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
)

// cgroupsFile lists the node's cgroup dirs (JSON), written by the agent when it makes them.
const cgroupsFile = "cgroups.json"

// Limits of a node's cgroups.
const (
	// cpuPeriodUs is the CFS period the node's CPU quota is given in.
	cpuPeriodUs = 100000
	// nodeRuntimeMiB is the memory a node's own runtime takes on top of its contract's:
	// the agent, containerd, the kubelet and a shim per pod (about 200 MiB RSS measured with
	// one pod); the contract's mem is what its pods get.
	nodeRuntimeMiB = 256
	// nodePidsMax bounds the node's processes and threads: a fork bomb in a pod ends at
	// the node.
	nodePidsMax = 4096
)

// cgroupLimits are what a node's cgroups enforce.
type cgroupLimits struct {
	CPUSet     string // cpuset.cpus, the CPUs the node runs on; "": its parent's
	CPUShares  int64  // cpu.shares (v1), the node's weight against others on its CPUs; 0: the default
	CPUQuotaUs int64  // per cpuPeriodUs; 0: none
	MemBytes   int64  // 0: none
	PidsMax    int64  // 0: none
	Devices    bool   // only deviceRules
}

func (l cgroupLimits) String() string {
	s := "cpu "
	switch {
	case l.CPUQuotaUs > 0:
		s += fmt.Sprintf("%.2f", float64(l.CPUQuotaUs)/cpuPeriodUs)
	case l.CPUSet != "":
		s += "cpuset " + l.CPUSet
	default:
		s += "unlimited"
	}
	if l.CPUShares > 0 {
		s += fmt.Sprintf(", cpu shares %d", l.CPUShares)
	}
	if l.MemBytes > 0 {
		s += fmt.Sprintf(", memory %d MiB", l.MemBytes>>20)
	}
	if l.PidsMax > 0 {
		s += fmt.Sprintf(", pids %d", l.PidsMax)
	}
	if l.Devices {
		s += ", devices: no block device"
	}
	return s
}

// cpuHost is what the CPU decision needs to know of the host, read by probeCPUHost.
type cpuHost struct {
	// V1: the cpu controller is on a cgroup v1 hierarchy, where the kernel refuses a
	// child's CFS quota above an ancestor's (v2 takes the smaller of the two instead).
	V1 bool
	// CPUs the node's parent cpuset holds, ascending; nil: no cpuset hierarchy.
	CPUs []int
	// Bound counts, for each CPU, the other live nodes whose cpuset holds it (a node
	// allowed every CPU is not counted).
	Bound map[int]int
}

// nodeLimits is the decision: a contained node's cgroups hold it to its contract's cpus
// (the node's runtime included) and its mem plus what the runtime itself takes; a node
// without a contract figure is not limited in it. An uncontained node (a node booted before
// containment, or the vm flavour's guest, limited by its machine) has no limits.
//
// The CPUs are bounded as a machine of that many CPUs is. On cgroup v1 a CFS quota on the
// node's cgroup would make the kernel refuse any container whose CPU limit is above the
// contract (tg_cfs_schedulable_down: a child's quota may not exceed an ancestor's), where
// a machine of that size runs it and gives it what the machine has. So on v1 the node gets
// a cpuset of cpus of the host's CPUs (those the fewest other nodes are bound to, ties
// broken from the node's host-wide index so nodes spread), no quota, and cpu.shares in
// proportion to its contract for when nodes share a CPU. A contract of the host's CPUs or
// more gets them all. Without a cpuset hierarchy the quota stays: the bound comes first,
// and such a container fails to start. On v2 the quota is right: the kernel takes the
// smaller of a child's and its ancestors', so the container runs.
func nodeLimits(contained bool, cpus, memMiB, index int, h cpuHost) cgroupLimits {
	if !contained {
		return cgroupLimits{}
	}
	l := cgroupLimits{PidsMax: nodePidsMax, Devices: true}
	if cpus > 0 {
		if !h.V1 || len(h.CPUs) == 0 {
			l.CPUQuotaUs = int64(cpus) * cpuPeriodUs
		} else {
			l.CPUShares = min(int64(cpus)*cpuSharesPerCPU, cpuSharesMax)
			if cpus < len(h.CPUs) {
				l.CPUSet = formatCPUList(pickCPUs(cpus, index, h))
			}
		}
	}
	if memMiB > 0 {
		l.MemBytes = int64(memMiB+nodeRuntimeMiB) << 20
	}
	return l
}

// cpu.shares of one CPU (the kernel's default for a cgroup) and its largest value.
const (
	cpuSharesPerCPU = 1024
	cpuSharesMax    = 262144
)

// pickCPUs chooses n of h.CPUs (n < len(h.CPUs)): the ones the fewest other nodes are
// bound to, ties broken in the order of the host's CPUs rotated by index, so nodes booted
// at once on an idle host still land apart. Ascending.
func pickCPUs(n, index int, h cpuHost) []int {
	order := make([]int, len(h.CPUs))
	for i := range order {
		order[i] = h.CPUs[(i+index)%len(h.CPUs)]
	}
	sort.SliceStable(order, func(i, j int) bool { return h.Bound[order[i]] < h.Bound[order[j]] })
	out := append([]int(nil), order[:n]...)
	sort.Ints(out)
	return out
}

// parseCPUList reads the kernel's CPU list format ("0-3,8,10-11").
func parseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("cpu list %q: bad cpu %q", s, part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	sort.Ints(out)
	return slices.Compact(out), nil
}

// formatCPUList writes ascending CPUs in the kernel's CPU list format.
func formatCPUList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

func (ns nodeState) limits(h cpuHost) cgroupLimits {
	return nodeLimits(ns.Contained, ns.CPUs, ns.MemMiB, ns.Index, h)
}

// probeCPUHost reads what nodeLimits needs of this host for a node cgroup named name, made
// below this process's own: whether the cpu controller is v1, the CPUs of the parent
// cpuset, and those the sibling nodes' cpusets hold (a sibling is a socialweb-node-*
// cgroup with a process in it or in its innerCgroup; other bidders' nodes are siblings too).
func probeCPUHost(name string) cpuHost {
	var h cpuHost
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return h
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	mounts := parseCgroupMounts(string(mi))
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[0] == "0" {
			continue
		}
		ctrls := strings.Split(parts[1], ",")
		if slices.Contains(ctrls, "cpu") {
			h.V1 = true
		}
		if !slices.Contains(ctrls, "cpuset") {
			continue
		}
		mount, ok := hierarchyDir(mounts, parts[0], parts[1])
		if !ok {
			continue
		}
		parent := filepath.Join("/sys/fs/cgroup", mount, parts[2])
		h.CPUs = readCPUList(parent, "cpuset.effective_cpus", "cpuset.cpus")
		sibs, _ := filepath.Glob(filepath.Join(parent, "socialweb-node-*"))
		for _, d := range sibs {
			if filepath.Base(d) == name {
				continue
			}
			if !hasProcs(d) && !hasProcs(filepath.Join(d, innerCgroup)) {
				continue
			}
			cpus := readCPUList(d, "cpuset.cpus")
			if len(cpus) == 0 || len(cpus) >= len(h.CPUs) {
				continue
			}
			if h.Bound == nil {
				h.Bound = map[int]int{}
			}
			for _, c := range cpus {
				h.Bound[c]++
			}
		}
	}
	return h
}

// hasProcs: the cgroup d holds a process.
func hasProcs(d string) bool {
	b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
	return err == nil && len(strings.TrimSpace(string(b))) > 0
}

// readCPUList reads the first of files in dir that holds a CPU list.
func readCPUList(dir string, files ...string) []int {
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		if cpus, err := parseCPUList(string(b)); err == nil && len(cpus) > 0 {
			return cpus
		}
	}
	return nil
}

// limitFiles are the files (relative to a hierarchy's cgroup dir, by hierarchy dir name)
// and values that enforce l, in the order they are written.
func limitFiles(hierarchy string, l cgroupLimits) [][2]string {
	var w [][2]string
	switch hierarchy {
	case "cpuset":
		if l.CPUSet != "" {
			w = append(w, [2]string{"cpuset.cpus", l.CPUSet})
		}
	case "cpu", "cpu,cpuacct", "cpuacct,cpu":
		if l.CPUShares > 0 {
			w = append(w, [2]string{"cpu.shares", strconv.FormatInt(l.CPUShares, 10)})
		}
		if l.CPUQuotaUs > 0 {
			w = append(w, [2]string{"cpu.cfs_period_us", strconv.Itoa(cpuPeriodUs)}, [2]string{"cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuotaUs, 10)})
		} else if l.CPUShares > 0 {
			// No quota: one left by an earlier boot of this node would refuse its pods' limits.
			w = append(w, [2]string{"cpu.cfs_quota_us", "-1"})
		}
	case "memory":
		if l.MemBytes > 0 {
			w = append(w, [2]string{"memory.limit_in_bytes", strconv.FormatInt(l.MemBytes, 10)})
		}
	case "pids":
		if l.PidsMax > 0 {
			w = append(w, [2]string{"pids.max", strconv.FormatInt(l.PidsMax, 10)})
		}
	case "devices":
		if l.Devices {
			w = append(w, [2]string{"devices.deny", "a"})
			for _, r := range deviceRules {
				w = append(w, [2]string{"devices.allow", r})
			}
		}
	case "":
		// The v2 hierarchy of a pure v2 host.
		if l.CPUQuotaUs > 0 {
			w = append(w, [2]string{"cpu.max", fmt.Sprintf("%d %d", l.CPUQuotaUs, cpuPeriodUs)})
		}
		if l.MemBytes > 0 {
			w = append(w, [2]string{"memory.max", strconv.FormatInt(l.MemBytes, 10)})
		}
		if l.PidsMax > 0 {
			w = append(w, [2]string{"pids.max", strconv.FormatInt(l.PidsMax, 10)})
		}
	}
	return w
}

// innerCgroup is the cgroup below a node's own in each hierarchy that the node's processes
// are in, and so the root of the node's cgroup namespace. Root in the node can write the
// files of its namespace's root cgroup (its cpuset.cpus, memory.limit_in_bytes,
// devices.allow); the limits are one level up, out of its view, and the kernel holds a
// child to its parent's.
const innerCgroup = "node"

// joinCgroups makes a cgroup named name below this process's own cgroup in each hierarchy
// (nested, so whatever limits the agent's parent has still apply), writes l's limits into
// it, makes innerCgroup below it and moves this process there; children inherit it. It
// returns the dirs named name. A hierarchy that is missing or not writable is skipped when
// l asks nothing of it; a limit that cannot be written is an error. An empty name (a vm
// guest's agent, in its machine's own cgroups) joins this process's own.
func joinCgroups(name string, l cgroupLimits) ([]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, nil
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	mounts := parseCgroupMounts(string(mi))
	var dirs []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		mount, ok := hierarchyDir(mounts, parts[0], parts[1])
		if !ok {
			continue
		}
		d := filepath.Join("/sys/fs/cgroup", mount, parts[2], name)
		if mount == "unified" {
			mount = "unified-v2" // no v2 controllers on a hybrid host: nothing to limit
		}
		limits := limitFiles(mount, l)
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			if len(limits) > 0 {
				return dirs, fmt.Errorf("cgroup %s: %w", d, err)
			}
			continue
		}
		if mount == "cpuset" {
			inheritCpuset(d)
		}
		for _, w := range limits {
			if err := os.WriteFile(filepath.Join(d, w[0]), []byte(w[1]), 0o644); err != nil {
				return append(dirs, d), fmt.Errorf("cgroup limit %s = %s: %w", filepath.Join(d, w[0]), w[1], err)
			}
		}
		join := d
		if name != "" {
			join = filepath.Join(d, innerCgroup)
			if err := os.Mkdir(join, 0o755); err != nil && !os.IsExist(err) {
				_ = os.Remove(d)
				if len(limits) > 0 {
					return dirs, fmt.Errorf("cgroup %s: %w", join, err)
				}
				continue
			}
			if mount == "cpuset" {
				inheritCpuset(join)
			}
		}
		if err := os.WriteFile(filepath.Join(join, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			if join != d {
				_ = os.Remove(join)
			}
			_ = os.Remove(d)
			if len(limits) > 0 {
				return dirs, fmt.Errorf("join cgroup %s: %w", d, err)
			}
			continue
		}
		dirs = append(dirs, d)
	}
	return dirs, nil
}

// inheritCpuset gives the new cpuset d its parent's CPUs and memory nodes: a new cpuset
// has none, and no process can join it until it has.
func inheritCpuset(d string) {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		v, _ := os.ReadFile(filepath.Join(filepath.Dir(d), f))
		_ = os.WriteFile(filepath.Join(d, f), v, 0o644)
	}
}

// hierarchyDir is the dir under /sys/fs/cgroup of the hierarchy a /proc/self/cgroup line
// names (id, controllers): the cgroup2 mount for "0" with none, else the v1 mount whose
// options are those controllers.
func hierarchyDir(mounts []cgroupMount, id, controllers string) (string, bool) {
	if id == "0" && controllers == "" {
		if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
			return "", true // a pure v2 host
		}
		for _, m := range mounts {
			if m.fstype == "cgroup2" {
				return m.dir, true
			}
		}
		return "", false
	}
	want := strings.Split(controllers, ",")
	sort.Strings(want)
	for _, m := range mounts {
		if m.fstype != "cgroup" {
			continue
		}
		var have []string
		for _, o := range strings.Split(m.opts, ",") {
			if o == strings.TrimPrefix(o, "name=") && !isController(o) {
				continue // a hierarchy option (xattr, clone_children), not a controller
			}
			have = append(have, o)
		}
		sort.Strings(have)
		if strings.Join(have, ",") == strings.Join(want, ",") {
			return m.dir, true
		}
	}
	return "", false
}

func isController(o string) bool {
	switch o {
	case "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "net_cls", "net_prio", "blkio",
		"perf_event", "hugetlb", "pids", "rdma", "misc":
		return true
	}
	return false
}

// removeCgroups kills what is left in the node's cgroups, deepest first (the cgroups of its
// containers are below them), and removes them.
func removeCgroups(dir string) error {
	var dirs []string
	if err := guestproc.ReadJSON(filepath.Join(dir, cgroupsFile), &dirs); err != nil {
		return nil
	}
	self := os.Getpid()
	var errs []error
	for _, top := range dirs {
		var tree []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				tree = append(tree, p)
			}
			return nil
		})
		sort.Slice(tree, func(i, j int) bool { return len(tree[i]) > len(tree[j]) })
		for _, d := range tree {
			for round := 0; round < 40; round++ {
				b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
				if err != nil {
					break
				}
				pids := strings.Fields(string(b))
				if len(pids) == 0 {
					break
				}
				for _, p := range pids {
					if pid, err := strconv.Atoi(p); err == nil && pid != self {
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
