package kube

import (
	"bufio"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
)

// madvPageout asks the kernel to reclaim the given pages now (Linux 5.4+).
const madvPageout = 21

// settleIdle lowers the heap target of a control plane that has finished starting, returns
// freed heap to the OS, and pages out the executable's mapped code and data: the start runs
// code (scheme registration, API installation, bootstrap policy) that an idle control plane
// never runs again. The pages stay in the page cache, shared by every control plane run
// from this binary; what an idle one touches again faults back in. It returns the bytes of
// the executable's mappings that were resident before.
func settleIdle(gcPercent int, memoryLimit int64) int64 {
	if gcPercent > 0 {
		debug.SetGCPercent(gcPercent)
	}
	// The start ran with the collector off under a safety limit (StartEnv); an idle
	// control plane gets no limit unless one is asked for: one under its live heap keeps
	// the collector running.
	if memoryLimit <= 0 {
		memoryLimit = math.MaxInt64
	}
	debug.SetMemoryLimit(memoryLimit)
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
