package scale

import "testing"

func TestSizeRangeFit(t *testing.T) {
	r := SizeRange{Min: Size{CPUs: 1, MemMiB: 512}, Max: Size{CPUs: 4, MemMiB: 3000}}
	for _, tc := range []struct {
		name string
		load Resources
		want Size
		ok   bool
	}{
		{"nothing asks the minimum", Resources{}, Size{1, 512}, true},
		{"a small pod the minimum", Resources{MilliCPU: 100, MemBytes: 64 << 20}, Size{1, 512}, true},
		{"cpu rounds up to whole CPUs", Resources{MilliCPU: 1001, MemBytes: 64 << 20}, Size{2, 512}, true},
		{"exact CPUs stay", Resources{MilliCPU: 3000}, Size{3, 512}, true},
		{"memory rounds up to the step", Resources{MilliCPU: 500, MemBytes: 513 << 20}, Size{1, 768}, true},
		{"memory rounding past max stays at max", Resources{MemBytes: 2900 << 20}, Size{1, 3000}, true},
		{"the largest size itself", Resources{MilliCPU: 4000, MemBytes: 3000 << 20}, Size{4, 3000}, true},
		{"too many CPUs", Resources{MilliCPU: 4001}, Size{4, 3000}, false},
		{"too much memory", Resources{MemBytes: 3001 << 20}, Size{4, 3000}, false},
		{"negative is nothing", Resources{MilliCPU: -5, MemBytes: -1}, Size{1, 512}, true},
	} {
		got, ok := r.Fit(tc.load)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: Fit(%+v) = %v, %v; want %v, %v", tc.name, tc.load, got, ok, tc.want, tc.ok)
		}
	}
}
