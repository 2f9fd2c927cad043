package substrate

import (
	"testing"
	"time"
)

// TestEndPoll: WaitEnded looks again after 10 ms, then twice as long each time, and never
// waits more than a second between two looks.
func TestEndPoll(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{
		{0, 10 * time.Millisecond},
		{1, 20 * time.Millisecond},
		{2, 40 * time.Millisecond},
		{6, 640 * time.Millisecond},
		{7, time.Second},
		{8, time.Second},
		{1000, time.Second},
	} {
		if got := endPoll(c.n); got != c.want {
			t.Errorf("endPoll(%d) = %s, want %s", c.n, got, c.want)
		}
	}
}
