package kube

import (
	"math"
	"runtime/debug"

	"socialweb.computer/internal/procmem"
)

// settleIdle lowers the heap target of a control plane that has finished starting, then
// hands back freed heap and the executable's pages the start touched (procmem.Settle): the
// start runs code (scheme registration, API installation, bootstrap policy) that an idle
// control plane never runs again. It returns the bytes Settle paged out.
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
	return procmem.Settle()
}
