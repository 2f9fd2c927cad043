package node

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"socialweb.computer/internal/substrate/guestproc"
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

// Sweep over a state dir of a dead node, a live one (its agent is this process) and a dir
// with no node.json: only the dead node's run dir and work dir go.
func TestSweepRemovesOnlyTheDeadNodesState(t *testing.T) {
	root := t.TempDir()
	run := t.TempDir()
	self, err := guestproc.ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	guest := func(id string, rec guestproc.Record, withState bool) (runDir, work string) {
		dir := filepath.Join(root, id)
		runDir, work = filepath.Join(run, id), filepath.Join(dir, workDir)
		for _, d := range []string{runDir, work} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if withState {
			// No netns, link or cgroups: the run dir and work dir stand for the host state.
			if err := guestproc.WriteJSON(filepath.Join(dir, nodeFile), nodeState{Dir: dir, RunDir: runDir, Contained: true}); err != nil {
				t.Fatal(err)
			}
		}
		if err := guestproc.WriteJSON(filepath.Join(dir, guestproc.PidFile), rec); err != nil {
			t.Fatal(err)
		}
		return runDir, work
	}
	deadRun, deadWork := guest("dead", guestproc.Record{PID: 1 << 30}, true)
	liveRun, liveWork := guest("live", guestproc.Record{PID: os.Getpid(), StartTicks: self.StartTicks}, true)
	unknownRun, _ := guest("unknown", guestproc.Record{PID: 1 << 30}, false)

	swept, err := SweepStateDir(context.Background(), root, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(swept) != 1 || swept[0].ID != "dead" || swept[0].Stopped || !slices.Contains(swept[0].Left, leftRunDir) || !slices.Contains(swept[0].Left, leftWork) {
		t.Errorf("swept %+v, want the dead node's run dir and work dir", swept)
	}
	for _, p := range []string{deadRun, deadWork} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left: %v", p, err)
		}
	}
	for _, p := range []string{liveRun, liveWork, unknownRun} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
}
