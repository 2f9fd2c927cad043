// Package procmem hands back the memory a long-running process of this binary needs only
// while it starts: the freed heap, and the pages of the executable that the start touched.
package procmem

import (
	"bufio"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
)

// madvPageout asks the kernel to reclaim the given pages now (Linux 5.4+).
const madvPageout = 21

// Settle returns freed heap to the OS and pages out the executable's read-only mappings
// (code and rodata). The binary links every component it can run (etcd, the API servers,
// the Kubernetes control plane), and their package initialisers and start-up code touch pages
// a settled process never runs again. The pages stay in the page cache, shared by every
// process run from this binary; what the process touches again faults back in. It returns
// the bytes of the mappings it asked the kernel to page out.
func Settle() int64 {
	debug.FreeOSMemory()
	exe, err := os.Executable()
	if err != nil {
		return 0
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe || strings.Contains(fields[1], "w") {
			continue // only the executable's read-only mappings (code, rodata)
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPageout); errno == 0 {
			total += int64(end - start)
		}
	}
	return total
}

// startGCPercent is the garbage collector's target while a process starts: the start builds
// its API servers' documents and decodes every schema once, mostly garbage by the time it
// is done, and at the default 100 the collector runs many cycles (and makes the start's
// goroutines assist it) over a heap that is about to be handed back anyway.
const startGCPercent = 400

// RelaxGCForStart sets the collector's target to startGCPercent unless the GOGC environment
// variable chose one, and returns the func that puts the target back (call it before Settle).
func RelaxGCForStart() (restore func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	old := debug.SetGCPercent(startGCPercent)
	return func() { debug.SetGCPercent(old) }
}
