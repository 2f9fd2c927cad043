package pds

import (
	"testing"
	"time"
)

func TestCrawlPolicy(t *testing.T) {
	p := crawlPolicy{Delay: 2 * time.Second, MinInterval: time.Minute, RetryBase: 2 * time.Second, RetryMax: 10 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		op     string // start, update, ok, fail
		now    time.Duration
		due    time.Duration
		noDue  bool
		failed int
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"start is at once", []step{{op: "start", now: 0, due: 0}}},
		{"nothing pending after a success", []step{{op: "start", now: 0, due: 0}, {op: "ok", now: 0, noDue: true}}},
		{"an update waits Delay", []step{
			{op: "start", now: 0, due: 0}, {op: "ok", now: 0, noDue: true},
			{op: "update", now: 5 * time.Minute, due: 5*time.Minute + 2*time.Second}}},
		{"an update soon after a success waits MinInterval", []step{
			{op: "start", now: 0, due: 0}, {op: "ok", now: 0, noDue: true},
			{op: "update", now: 10 * time.Second, due: time.Minute}}},
		{"updates while pending do not postpone", []step{
			{op: "start", now: 0, due: 0}, {op: "ok", now: 0, noDue: true},
			{op: "update", now: 2 * time.Minute, due: 2*time.Minute + 2*time.Second},
			{op: "update", now: 2*time.Minute + time.Second, due: 2*time.Minute + 2*time.Second}}},
		{"failures back off and are capped", []step{
			{op: "start", now: 0, due: 0},
			{op: "fail", now: 0, due: 2 * time.Second, failed: 1},
			{op: "fail", now: 2 * time.Second, due: 6 * time.Second, failed: 2},
			{op: "fail", now: 6 * time.Second, due: 14 * time.Second, failed: 3},
			{op: "fail", now: 14 * time.Second, due: 24 * time.Second, failed: 4},
			{op: "fail", now: 24 * time.Second, due: 34 * time.Second, failed: 5},
			{op: "ok", now: 34 * time.Second, noDue: true}}},
		{"an update during retries keeps the retry schedule", []step{
			{op: "start", now: 0, due: 0},
			{op: "fail", now: 0, due: 2 * time.Second, failed: 1},
			{op: "update", now: time.Second, due: 2 * time.Second, failed: 1}}},
		{"after a retried success the next update starts fresh", []step{
			{op: "start", now: 0, due: 0},
			{op: "fail", now: 0, due: 2 * time.Second, failed: 1},
			{op: "ok", now: 2 * time.Second, noDue: true},
			{op: "update", now: 3 * time.Minute, due: 3*time.Minute + 2*time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st relayState
			for i, s := range tc.steps {
				switch s.op {
				case "start":
					st = p.start(at(s.now))
				case "update":
					st = p.update(st, at(s.now))
				case "ok":
					st = p.attempted(st, at(s.now), true)
				case "fail":
					st = p.attempted(st, at(s.now), false)
				}
				d, ok := p.due(st)
				if ok == s.noDue || (ok && !d.Equal(at(s.due))) || st.Failures != s.failed {
					t.Fatalf("step %d (%s at %s): due %v (%v), failures %d; want due %s (none: %v), failures %d",
						i, s.op, s.now, d.Sub(t0), ok, st.Failures, s.due, s.noDue, s.failed)
				}
			}
		})
	}
}
