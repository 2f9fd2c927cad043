package node

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	CPUQuotaUs int64 // per cpuPeriodUs; 0: none
	MemBytes   int64 // 0: none
	PidsMax    int64 // 0: none
	Devices    bool  // only deviceRules
}

func (l cgroupLimits) String() string {
	s := "cpu "
	if l.CPUQuotaUs > 0 {
		s += fmt.Sprintf("%.2f", float64(l.CPUQuotaUs)/cpuPeriodUs)
	} else {
		s += "unlimited"
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

// nodeLimits is the decision: a contained node's cgroups hold it to its contract's cpus
// (the quota of that many CPUs, the node's runtime included) and its mem plus what the
// runtime itself takes; a node without a contract figure is not limited in it. An
// uncontained node (a node booted before containment, or the vm flavour's guest, limited by
// its machine) has no limits.
func nodeLimits(contained bool, cpus, memMiB int) cgroupLimits {
	if !contained {
		return cgroupLimits{}
	}
	l := cgroupLimits{PidsMax: nodePidsMax, Devices: true}
	if cpus > 0 {
		l.CPUQuotaUs = int64(cpus) * cpuPeriodUs
	}
	if memMiB > 0 {
		l.MemBytes = int64(memMiB+nodeRuntimeMiB) << 20
	}
	return l
}

func (ns nodeState) limits() cgroupLimits { return nodeLimits(ns.Contained, ns.CPUs, ns.MemMiB) }

// limitFiles are the files (relative to a hierarchy's cgroup dir, by hierarchy dir name)
// and values that enforce l, in the order they are written.
func limitFiles(hierarchy string, l cgroupLimits) [][2]string {
	var w [][2]string
	switch hierarchy {
	case "cpu", "cpu,cpuacct", "cpuacct,cpu":
		if l.CPUQuotaUs > 0 {
			w = append(w, [2]string{"cpu.cfs_period_us", strconv.Itoa(cpuPeriodUs)}, [2]string{"cpu.cfs_quota_us", strconv.FormatInt(l.CPUQuotaUs, 10)})
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

// joinCgroups makes a cgroup named name below this process's own cgroup in each hierarchy
// (nested, so whatever limits the agent's parent has still apply), writes l's limits into
// it and moves this process into it; children inherit it. It returns the dirs made. A
// hierarchy that is missing or not writable is skipped when l asks nothing of it; a limit
// that cannot be written is an error.
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
			// A new cpuset has no CPUs and no memory nodes: it takes its parent's.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, _ := os.ReadFile(filepath.Join(filepath.Dir(d), f))
				_ = os.WriteFile(filepath.Join(d, f), v, 0o644)
			}
		}
		for _, w := range limits {
			if err := os.WriteFile(filepath.Join(d, w[0]), []byte(w[1]), 0o644); err != nil {
				return append(dirs, d), fmt.Errorf("cgroup limit %s = %s: %w", filepath.Join(d, w[0]), w[1], err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
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
