package tenant

import (
	"testing"
	"time"
)

func TestDecideSleep(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	after := 5 * time.Minute
	idle := Idleness{SleepAfter: after, Now: t0, ReadyAt: t0.Add(-time.Hour), LastActive: t0.Add(-10 * time.Minute)}
	with := func(f func(*Idleness)) Idleness { in := idle; f(&in); return in }
	for _, tc := range []struct {
		name    string
		in      Idleness
		sleep   bool
		recheck time.Duration
	}{
		{"unused past sleepAfter sleeps", idle, true, 0},
		{"sleep off", with(func(in *Idleness) { in.SleepAfter = 0 }), false, 0},
		{"a node keeps it awake", with(func(in *Idleness) { in.Nodes = 1 }), false, 0},
		{"a claim keeps it awake", with(func(in *Idleness) { in.Claims = 1 }), false, 0},
		{"pending pods waiting for a node keep it awake", with(func(in *Idleness) { in.Demand = true }), false, 0},
		{"an open watch keeps it awake", with(func(in *Idleness) { in.OpenConns = 1 }), false, after},
		{"a recent request: sleeps when sleepAfter has passed since it",
			with(func(in *Idleness) { in.LastActive = t0.Add(-2 * time.Minute) }), false, 3 * time.Minute},
		{"a recent start counts as use",
			with(func(in *Idleness) { in.ReadyAt = t0.Add(-time.Minute) }), false, 4 * time.Minute},
		{"the last node left a minute ago",
			with(func(in *Idleness) { in.LastBusy = t0.Add(-time.Minute) }), false, 4 * time.Minute},
		{"exactly sleepAfter since the last request", with(func(in *Idleness) { in.LastActive = t0.Add(-after) }), true, 0},
		{"a clock behind the last request", with(func(in *Idleness) { in.LastActive = t0.Add(time.Minute) }), false, after + time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideSleep(tc.in)
			if d.Sleep != tc.sleep || d.RecheckAfter != tc.recheck || d.Why == "" {
				t.Errorf("DecideSleep = %+v; want sleep %v, recheck %v, and a reason", d, tc.sleep, tc.recheck)
			}
		})
	}
}
