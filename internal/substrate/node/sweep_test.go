package node

import (
	"slices"
	"testing"
)

func TestSweepPlan(t *testing.T) {
	dead := func(id string, left ...string) sweepFacts { return sweepFacts{ID: id, Known: true, Left: left} }
	live := func(id string) sweepFacts { return sweepFacts{ID: id, Known: true, Alive: true} }
	for _, tc := range []struct {
		name        string
		guests      []sweepFacts
		release     bool
		stop, sweep []string
	}{
		{"nothing", nil, false, nil, nil},
		{"a running node is adopted, not swept", []sweepFacts{live("a")}, false, nil, nil},
		{"a dead node with a netns left is swept", []sweepFacts{dead("a", leftNetns, leftChain)}, false, nil, []string{"a"}},
		{"a dead node that left nothing is let be", []sweepFacts{dead("a")}, false, nil, nil},
		{"an unreadable node.json names nothing to sweep", []sweepFacts{{ID: "a", Left: []string{leftNetns}}}, false, nil, nil},
		{"mixed: only the dead one with state", []sweepFacts{live("a"), dead("b", leftRunDir), dead("c")}, false, nil, []string{"b"}},
		{"release stops the running ones and sweeps the dead", []sweepFacts{live("a"), dead("b", leftCgroups), dead("c")}, true, []string{"a"}, []string{"b"}},
		{"release leaves an unknown guest", []sweepFacts{{ID: "a", Alive: true}}, true, nil, nil},
	} {
		stop, sweep := sweepPlan(tc.guests, tc.release)
		if !slices.Equal(stop, tc.stop) || !slices.Equal(sweep, tc.sweep) {
			t.Errorf("%s: sweepPlan = stop %v, sweep %v; want stop %v, sweep %v", tc.name, stop, sweep, tc.stop, tc.sweep)
		}
	}
}
