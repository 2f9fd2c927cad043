package guestproc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseStatOddComm(t *testing.T) {
	st, err := parseStat(42, []byte("42 (a) b (c) S 1 40 40 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 1 0 987654 1 2 3"))
	if err != nil {
		t.Fatal(err)
	}
	if st.State != 'S' || st.PPID != 1 || st.PGID != 40 || st.StartTicks != 987654 || st.CPU != 2*time.Second {
		t.Fatalf("%+v", st)
	}
}

func TestTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	os.WriteFile(p, []byte("a\nb\nc\n"), 0o600)
	for n, want := range map[int]string{0: "a\nb\nc\n", 1: "c\n", 2: "b\nc\n", 5: "a\nb\nc\n"} {
		if got, _ := Tail(p, n); string(got) != want {
			t.Errorf("tail %d = %q, want %q", n, got, want)
		}
	}
}

// A guest that exits by itself: the supervisor records its status and
// deletes the cleanup entries; nothing of the group is left.
func TestSupervisorRecordsExitAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "secrets"), 0o700)
	rec, err := Start(StartOptions{Dir: dir, Argv: []string{"/bin/sh", "-c", "echo out; exit 4"}, Cwd: dir, Cleanup: []string{"secrets"}})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _, ok := Exit(dir); ok {
			if code != 4 {
				t.Fatalf("exit %d", code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no exit status")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(dir, "secrets")); !os.IsNotExist(err) {
		t.Fatal("cleanup entry left")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, LogFile)); string(b) != "out\n" {
		t.Fatalf("log %q", b)
	}
	if err := KillGroup(context.Background(), rec.PID, time.Second); err != nil {
		t.Fatal(err)
	}
	if rec.Alive() || len(GroupMembers(rec.PID, true)) != 0 {
		t.Fatal("group left")
	}
}

// A guest that ignores SIGTERM is killed after the grace. Its own child
// (orphaned by the SIGKILL) is reaped by init, on init's schedule, so only
// live members are checked.
func TestKillGroupEscalates(t *testing.T) {
	dir := t.TempDir()
	rec, err := Start(StartOptions{Dir: dir, Argv: []string{"/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"}, Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	if err := KillGroup(context.Background(), rec.PID, 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 200*time.Millisecond || d > 5*time.Second {
		t.Fatalf("stop took %s", d)
	}
	if m := GroupMembers(rec.PID, false); len(m) != 0 || rec.Alive() {
		t.Fatalf("members left: %v", m)
	}
}

// A guest removed (it had ended) between a caller's listing and its Stop leaves nothing to
// stop: Stop answers nil, not the missing directory.
func TestStopOfARemovedGuest(t *testing.T) {
	if err := Stop(context.Background(), filepath.Join(t.TempDir(), "gone"), time.Second); err != nil {
		t.Fatalf("Stop of a removed guest: %v", err)
	}
}
