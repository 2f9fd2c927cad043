package procmem

import (
	"context"
	"runtime/metrics"
	"time"
)

// Heap is what the runtime holds for the heap at one moment.
type Heap struct {
	// Retained is the heap's memory the process holds: objects (live, or dead and not yet
	// swept), the unused parts of their spans, and free spans not yet handed back to the OS.
	Retained uint64
	// Allocated is the bytes allocated since the process started (it only grows).
	Allocated uint64
}

// Thresholds of Decide.
const (
	// BurstBytes is what a process allocates between two samples in a burst of work: far
	// above what up allocates at rest (about 0.2 MiB/s).
	BurstBytes = 64 << 20
	// QuietBytes is the most a process allocates between two samples once a burst is over:
	// a process allocating more is using the heap it holds, and would only map it again.
	QuietBytes = 16 << 20
	// SettleSlack is how far the retained heap may stand above what the last settle left
	// before handing it back is worth a collection.
	SettleSlack = 16 << 20
)

// Decide says whether to hand back the heap now (settle), and whether a burst is still to be
// followed by a settle (burst), from the heap at the previous sample (prev), now (cur), what
// the last settle left (base), and whether a burst was under way (burst). A burst starts
// with an interval that allocates more than BurstBytes; it ends with one that allocates at
// most QuietBytes, and then, if the heap stands more than SettleSlack above base, the
// process settles. A process at rest never settles here: the collector's own pace holds.
//
// Go hands freed heap back lazily: the background scavenger keeps what the heap goal of the
// last collection allows, and a process at rest collects only every two minutes, so a goal
// set during a burst (hundreds of MiB) holds the burst's pages for minutes after it ends.
func Decide(prev, cur Heap, base uint64, burst bool) (settle, stillBurst bool) {
	allocated := cur.Allocated - prev.Allocated
	switch {
	case allocated > BurstBytes:
		return false, true
	case !burst || allocated > QuietBytes:
		return false, burst
	}
	return cur.Retained > base+SettleSlack, false
}

var heapMetrics = []string{
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/gc/heap/allocs:bytes",
}

// ReadHeap samples the runtime's heap.
func ReadHeap() Heap {
	s := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return Heap{Retained: v(0) + v(1) + v(2), Allocated: v(3)}
}

// Watch samples the heap every interval until ctx ends and settles the process (Settle) once
// a burst is over (Decide): memory a burst of requests made the heap grow to goes back once
// the burst ends, not minutes later. Call it right after Settle: the heap then is the first
// base, and each settle here leaves the next.
func Watch(ctx context.Context, interval time.Duration, settled func(before, after Heap)) {
	prev := ReadHeap()
	base, burst := prev.Retained, false
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := ReadHeap()
		var settle bool
		if settle, burst = Decide(prev, cur, base, burst); settle {
			Settle()
			after := ReadHeap()
			base = after.Retained
			if settled != nil {
				settled(cur, after)
			}
			cur = after
		}
		prev = cur
	}
}
