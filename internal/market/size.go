package market

import (
	"errors"
	"fmt"
	"math"
)

// Size is a guest's size: its CPUs and its memory in MiB (a compute.vm payload's cpus and
// mem, a bid's size).
type Size struct {
	CPUs, MemMiB int64
}

// String is the size as a user reads it: "1 CPU, 256 MiB".
func (s Size) String() string {
	unit := "CPUs"
	if s.CPUs == 1 {
		unit = "CPU"
	}
	return fmt.Sprintf("%d %s, %d MiB", s.CPUs, unit, s.MemMiB)
}

// Covers says whether a guest of size s holds one of size asked: at least its CPUs and at
// least its memory.
func (s Size) Covers(asked Size) bool {
	return s.CPUs >= asked.CPUs && s.MemMiB >= asked.MemMiB
}

// Pricing is a bidder's price of a guest per hour by its size, each part in the smallest
// unit of its currency: Base per guest, PerCPU for each CPU, PerGiB for each GiB of memory.
type Pricing struct {
	Base, PerCPU, PerGiB int64
}

// ErrPriceOverflow: a price past what a bid's cost can hold.
var ErrPriceOverflow = errors.New("overflows a 64-bit cost")

// Price is Base + CPUs*PerCPU + ceil(MemMiB*PerGiB/1024): memory is charged per MiB at
// PerGiB/1024, rounded up so that a part of a GiB never costs nothing. It is an error,
// never a wrapped number, when the parts are negative, the size is not a guest's, or the
// price does not fit in int64 (an rfp may ask any size the lexicon allows).
func (p Pricing) Price(s Size) (int64, error) {
	if p.Base < 0 || p.PerCPU < 0 || p.PerGiB < 0 {
		return 0, fmt.Errorf("a negative price (cost %d, per CPU %d, per GiB %d)", p.Base, p.PerCPU, p.PerGiB)
	}
	if s.CPUs < 1 || s.MemMiB < 1 {
		return 0, fmt.Errorf("no price for a guest of %s", s)
	}
	cpu, ok := mulInt64(s.CPUs, p.PerCPU)
	if !ok {
		return 0, fmt.Errorf("%d CPUs at %d per CPU: %w", s.CPUs, p.PerCPU, ErrPriceOverflow)
	}
	// In 1024ths of the price, so that a part of a GiB is charged its part.
	memKibis, ok := mulInt64(s.MemMiB, p.PerGiB)
	if !ok {
		return 0, fmt.Errorf("%d MiB at %d per GiB: %w", s.MemMiB, p.PerGiB, ErrPriceOverflow)
	}
	mem := memKibis / 1024
	if memKibis%1024 != 0 {
		mem++
	}
	total, ok := addInt64(p.Base, cpu)
	if ok {
		total, ok = addInt64(total, mem)
	}
	if !ok {
		return 0, fmt.Errorf("cost %d + %d for the CPUs + %d for the memory: %w", p.Base, cpu, mem, ErrPriceOverflow)
	}
	return total, nil
}

// mulInt64 is a*b for a, b >= 0, and false when it does not fit.
func mulInt64(a, b int64) (int64, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > math.MaxInt64/b {
		return 0, false
	}
	return a * b, true
}

// addInt64 is a+b for a, b >= 0, and false when it does not fit.
func addInt64(a, b int64) (int64, bool) {
	if a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}
