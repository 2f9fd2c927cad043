package procmem

import "testing"

func TestDecide(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name               string
		prev, cur          Heap
		base               uint64
		burst              bool
		settle, stillBurst bool
	}{
		{"at rest", Heap{Allocated: 100 * mib}, Heap{Retained: 90 * mib, Allocated: 101 * mib}, 40 * mib, false, false, false},
		{"at rest with a heap grown past the slack", Heap{Allocated: 100 * mib}, Heap{Retained: 200 * mib, Allocated: 101 * mib}, 40 * mib, false, false, false},
		{"busy without a burst", Heap{Allocated: 100 * mib}, Heap{Retained: 90 * mib, Allocated: 140 * mib}, 40 * mib, false, false, false},
		{"a burst starts", Heap{Allocated: 100 * mib}, Heap{Retained: 400 * mib, Allocated: 900 * mib}, 40 * mib, false, false, true},
		{"a burst goes on", Heap{Allocated: 900 * mib}, Heap{Retained: 400 * mib, Allocated: 1800 * mib}, 40 * mib, true, false, true},
		{"a burst slows", Heap{Allocated: 900 * mib}, Heap{Retained: 400 * mib, Allocated: 940 * mib}, 40 * mib, true, false, true},
		{"a burst is over", Heap{Allocated: 900 * mib}, Heap{Retained: 400 * mib, Allocated: 902 * mib}, 40 * mib, true, true, false},
		{"quiet by exactly QuietBytes", Heap{Allocated: 900 * mib}, Heap{Retained: 400 * mib, Allocated: 900*mib + QuietBytes}, 40 * mib, true, true, false},
		{"a burst that left the heap within the slack", Heap{Allocated: 900 * mib}, Heap{Retained: 56 * mib, Allocated: 901 * mib}, 40 * mib, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			settle, still := Decide(tc.prev, tc.cur, tc.base, tc.burst)
			if settle != tc.settle || still != tc.stillBurst {
				t.Errorf("Decide(%+v, %+v, %d, %v) = %v, %v, want %v, %v", tc.prev, tc.cur, tc.base, tc.burst, settle, still, tc.settle, tc.stillBurst)
			}
		})
	}
}

func TestReadHeap(t *testing.T) {
	h := ReadHeap()
	buf := make([]byte, 8<<20)
	buf[0] = 1
	h2 := ReadHeap()
	if h.Retained == 0 || h2.Allocated < h.Allocated+8<<20 {
		t.Errorf("ReadHeap: %+v then %+v after allocating 8 MiB", h, h2)
	}
	_ = buf[0]
}
