package jail

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
)

// Limits are a guest's cgroup limits; a zero field sets no limit of that kind.
type Limits struct {
	CPUs   int // CPU time: CPUs full CPUs per period (CFS quota)
	MemMiB int // memory, swap excluded (and no swap beyond it)
	Pids   int // tasks (processes and threads)
}

// cfsPeriod is the CFS period the CPU quota is given in, in microseconds (the kernel's
// default).
const cfsPeriod = 100000

// Cgroups makes and removes guests' cgroups in the host's cgroup hierarchy: v1 (one
// hierarchy per controller, as on a hybrid host) or v2 (one unified hierarchy), chosen by
// ProbeCgroups.
type Cgroups interface {
	// Version is 1 or 2.
	Version() int
	// Create makes the cgroup name (in every hierarchy the limits need) with l set, and
	// returns its directories, each with a cgroup.procs to join.
	Create(name string, l Limits) ([]string, error)
}

// ProbeCgroups picks the hierarchy of the host whose cgroup file system is mounted at root
// (/sys/fs/cgroup): v2 when root itself is a cgroup2 mount with the memory, cpu and pids
// controllers available, else v1 when the memory, cpu and pids hierarchies are mounted below
// it. Guests' cgroups go below parent ("socialweb-guests"), itself below this process's own
// cgroup in v1 (so limits on the caller still bound its guests) and below the parent of its
// own in v2 (a v2 cgroup that has processes cannot hand controllers to children).
func ProbeCgroups(root, parent string) (Cgroups, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		have := strings.Fields(string(b))
		for _, want := range []string{"memory", "cpu", "pids"} {
			if !contains(have, want) {
				return nil, fmt.Errorf("cgroup v2 at %s lacks the %s controller (has %v)", root, want, have)
			}
		}
		own := ownCgroup(string(self), "")
		base := filepath.Dir(own)
		if own == "/" {
			base = "/"
		}
		return v2{dir: filepath.Join(root, base, parent)}, nil
	}
	dirs := map[string]string{}
	for _, ctrl := range []string{"memory", "cpu", "pids"} {
		if _, err := os.Stat(filepath.Join(root, ctrl, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("no cgroup v2 at %s and no v1 %s hierarchy: %v", root, ctrl, err)
		}
		dirs[ctrl] = filepath.Join(root, ctrl, ownCgroup(string(self), ctrl), parent)
	}
	return v1{dirs: dirs}, nil
}

// ownCgroup is this process's cgroup path in the hierarchy of controller ctrl ("" for v2)
// from /proc/self/cgroup's text.
func ownCgroup(self, ctrl string) string {
	for _, line := range strings.Split(strings.TrimSpace(self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if ctrl == "" && parts[0] == "0" && parts[1] == "" {
			return parts[2]
		}
		if ctrl != "" && contains(strings.Split(parts[1], ","), ctrl) {
			return parts[2]
		}
	}
	return "/"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// V1Files are the files a v1 cgroup with limits l gets, per controller (pure: the table
// tests read it).
func V1Files(l Limits) map[string]map[string]string {
	f := map[string]map[string]string{"memory": {}, "cpu": {}, "pids": {}}
	if l.MemMiB > 0 {
		f["memory"]["memory.limit_in_bytes"] = strconv.FormatInt(int64(l.MemMiB)<<20, 10)
		// Memory and swap together capped at the same: no swap beyond the limit (after
		// memory.limit_in_bytes, which the name order gives: memsw may not be below it).
		f["memory"]["memory.memsw.limit_in_bytes"] = strconv.FormatInt(int64(l.MemMiB)<<20, 10)
		f["memory"]["memory.swappiness"] = "0"
	}
	if l.CPUs > 0 {
		f["cpu"]["cpu.cfs_period_us"] = strconv.Itoa(cfsPeriod)
		f["cpu"]["cpu.cfs_quota_us"] = strconv.Itoa(l.CPUs * cfsPeriod)
	}
	if l.Pids > 0 {
		f["pids"]["pids.max"] = strconv.Itoa(l.Pids)
	}
	return f
}

// V2Files are the files a v2 cgroup with limits l gets (pure).
func V2Files(l Limits) map[string]string {
	f := map[string]string{}
	if l.MemMiB > 0 {
		f["memory.max"] = strconv.FormatInt(int64(l.MemMiB)<<20, 10)
		f["memory.swap.max"] = "0"
		f["memory.oom.group"] = "1"
	}
	if l.CPUs > 0 {
		f["cpu.max"] = strconv.Itoa(l.CPUs*cfsPeriod) + " " + strconv.Itoa(cfsPeriod)
	}
	if l.Pids > 0 {
		f["pids.max"] = strconv.Itoa(l.Pids)
	}
	return f
}

type v1 struct{ dirs map[string]string }

func (v1) Version() int { return 1 }

func (c v1) Create(name string, l Limits) ([]string, error) {
	var made []string
	files := V1Files(l)
	for _, ctrl := range []string{"memory", "cpu", "pids"} {
		d := filepath.Join(c.dirs[ctrl], name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			_ = RemoveCgroups(made)
			return nil, err
		}
		made = append(made, d)
		if err := writeFiles(d, files[ctrl]); err != nil {
			_ = RemoveCgroups(made)
			return nil, err
		}
	}
	return made, nil
}

type v2 struct{ dir string }

func (v2) Version() int { return 2 }

func (c v2) Create(name string, l Limits) ([]string, error) {
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, err
	}
	// Hand the controllers down: to the guests' parent (from its parent), then to each guest.
	for _, d := range []string{filepath.Dir(c.dir), c.dir} {
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+memory +cpu +pids"), 0); err != nil {
			return nil, fmt.Errorf("enable controllers in %s: %v", d, err)
		}
	}
	d := filepath.Join(c.dir, name)
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	if err := writeFiles(d, V2Files(l)); err != nil {
		_ = RemoveCgroups([]string{d})
		return nil, err
	}
	return []string{d}, nil
}

func writeFiles(dir string, files map[string]string) error {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names) // cfs_period before cfs_quota
	for _, n := range names {
		p := filepath.Join(dir, n)
		if n == "memory.swappiness" || n == "memory.memsw.limit_in_bytes" {
			// Not every v1 kernel has them (swap accounting is a boot option); best effort.
			_ = os.WriteFile(p, []byte(files[n]), 0)
			continue
		}
		if err := os.WriteFile(p, []byte(files[n]), 0); err != nil {
			return fmt.Errorf("cgroup %s = %s: %v", p, files[n], err)
		}
	}
	return nil
}

// RemoveCgroups kills what is left in the cgroup directories and removes them; a directory
// already gone is fine.
func RemoveCgroups(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			continue
		}
		for round := 0; ; round++ {
			// v2 kills the whole cgroup at once; v1 is signalled process by process.
			_ = os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0)
			b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			pids := strings.Fields(string(b))
			if err != nil || len(pids) == 0 {
				break
			}
			if round == 100 {
				errs = append(errs, fmt.Errorf("cgroup %s: processes %v do not die", d, pids))
				break
			}
			for _, p := range pids {
				if pid, err := strconv.Atoi(p); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		var err error
		for i := 0; i < 50; i++ {
			// rmdir fails with EBUSY while the last tasks are still being torn down.
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %v", d, err))
		}
	}
	return errors.Join(errs...)
}

// OOMKilled reports whether the kernel's OOM killer killed a process of one of the cgroup
// directories (v1 memory.oom_control or v2 memory.events, field oom_kill).
func OOMKilled(dirs []string) bool {
	for _, d := range dirs {
		for _, f := range []string{"memory.events", "memory.oom_control"} {
			b, err := os.ReadFile(filepath.Join(d, f))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" && strings.TrimSpace(v) != "0" {
					return true
				}
			}
		}
	}
	return false
}
