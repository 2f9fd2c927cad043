package node

import (
	"testing"
	"time"
)

func TestRestartAfter(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	ago := func(ds ...time.Duration) []time.Time {
		var ts []time.Time
		for _, d := range ds {
			ts = append(ts, now.Add(-d))
		}
		return ts
	}
	for _, tc := range []struct {
		name  string
		prev  []time.Time
		delay time.Duration
		again bool
	}{
		{"first end", nil, time.Second, true},
		{"second", ago(time.Minute), 2 * time.Second, true},
		{"fourth", ago(3*time.Minute, 2*time.Minute, time.Minute), 8 * time.Second, true},
		{"fifth", ago(4*time.Minute, 3*time.Minute, 2*time.Minute, time.Minute), 16 * time.Second, true},
		{"sixth within the window: the node fails", ago(5*time.Minute, 4*time.Minute, 3*time.Minute, 2*time.Minute, time.Minute), 0, false},
		{"old restarts do not count", ago(time.Hour, 50*time.Minute, 40*time.Minute, 30*time.Minute, 20*time.Minute), time.Second, true},
		{"capped", ago(9*time.Minute, 8*time.Minute, 7*time.Minute, 6*time.Minute, time.Hour, 2*time.Hour), 16 * time.Second, true},
	} {
		delay, again := restartAfter(tc.prev, now)
		if delay != tc.delay || again != tc.again {
			t.Errorf("%s: restartAfter = %s, %v; want %s, %v", tc.name, delay, again, tc.delay, tc.again)
		}
	}
}
