package scale

import "fmt"

// MemStepMiB is the step node memory is rented in: a node's memory is rounded up to it.
const MemStepMiB = 256

// Size is what one node's contract asks the market for, and what the node then advertises
// as allocatable: whole CPUs and memory in MiB.
type Size struct {
	CPUs   int32
	MemMiB int32
}

// Resources is the size as allocatable CPU and memory.
func (s Size) Resources() Resources {
	return Resources{MilliCPU: int64(s.CPUs) * 1000, MemBytes: int64(s.MemMiB) << 20}
}

func (s Size) String() string { return fmt.Sprintf("%d CPU, %d MiB", s.CPUs, s.MemMiB) }

// SizeRange bounds the sizes a cluster rents its nodes at (Min <= Max in each resource).
type SizeRange struct {
	Min, Max Size
}

// DefaultSizeRange is the range of a Cluster that states none: a node of 1 CPU and 256
// MiB, the smallest a contract asks for, up to 2 CPUs and 4 GiB.
var DefaultSizeRange = SizeRange{Min: Size{CPUs: 1, MemMiB: 256}, Max: Size{CPUs: 2, MemMiB: 4096}}

// Fit is the smallest size of r that holds load: its CPU rounded up to whole CPUs and its
// memory up to MemStepMiB, at least r.Min. ok is false when load exceeds r.Max; the size
// is then r.Max.
func (r SizeRange) Fit(load Resources) (s Size, ok bool) {
	cpus := ceilDiv(max(load.MilliCPU, 0), 1000)
	memMiB := ceilDiv(ceilDiv(max(load.MemBytes, 0), 1<<20), MemStepMiB) * MemStepMiB
	if cpus > int64(r.Max.CPUs) || memMiB > int64(r.Max.MemMiB) {
		// Rounding must not push a load that fits the largest size beyond it.
		if load.MilliCPU > int64(r.Max.CPUs)*1000 || load.MemBytes > int64(r.Max.MemMiB)<<20 {
			return r.Max, false
		}
	}
	s = Size{CPUs: int32(min(max(cpus, int64(r.Min.CPUs)), int64(r.Max.CPUs))),
		MemMiB: int32(min(max(memMiB, int64(r.Min.MemMiB)), int64(r.Max.MemMiB)))}
	return s, true
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
