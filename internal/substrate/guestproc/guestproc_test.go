package guestproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
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

// A guest whose pid.json was never written (its starter died right after the spawn) is
// found by its supervisor's command line and stopped, group and all; a guest of another dir
// is left alone.
func TestStopWithoutPidFileFindsTheSupervisor(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	c, err := Spawn(StartOptions{Dir: dir, Argv: []string{"/bin/sh", "-c", "sleep 600 & wait"}, Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	o, err := Spawn(StartOptions{Dir: other, Argv: []string{"/bin/sleep", "600"}, Cwd: other})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = KillGroup(context.Background(), o.PID, time.Second) })
	if err := os.Remove(filepath.Join(dir, PidFile)); err != nil {
		t.Fatal(err)
	}
	if got := SupervisorOf(dir); got != c.PID {
		t.Fatalf("SupervisorOf = %d, want %d", got, c.PID)
	}
	if err := Stop(context.Background(), dir, time.Second); err != nil {
		t.Fatal(err)
	}
	waitDone(t, c, 10*time.Second)
	if m := GroupMembers(c.PID, false); len(m) != 0 {
		t.Fatalf("members %v of the guest's group left", m)
	}
	if SupervisorOf(dir) != 0 {
		t.Fatal("a supervisor of the stopped guest still runs")
	}
	if !o.Alive() {
		t.Fatal("the guest of another dir was stopped too")
	}
}

func waitDone(t *testing.T, c *Child, within time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(within):
		t.Fatalf("child %d still running after %s", c.PID, within)
	}
}

// A direct guest is the pid it records (its log and pid file where the
// caller put them), and its Stop kills the whole group once the grace has
// passed, not a grace later as a supervisor-led group's. (No member is
// orphaned: the guest ignores SIGTERM and has no children.)
func TestDirectChildStopsAfterOneGrace(t *testing.T) {
	dir := t.TempDir()
	log, pidFile := filepath.Join(dir, "cp.log"), filepath.Join(dir, "cp.pid")
	c, err := Spawn(StartOptions{Dir: dir, Log: log, PidFile: pidFile, Direct: true, Cwd: dir,
		Argv: []string{"/bin/sh", "-c", "echo up; trap '' TERM; exec sleep 600"}})
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	if err := ReadJSON(pidFile, &rec); err != nil || rec != c.Record || !rec.Direct || !rec.Alive() {
		t.Fatalf("pid file %+v (%v), want %+v alive", rec, err, c.Record)
	}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c.PID))
		if strings.HasPrefix(string(cmd), "sleep\x00600") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("pid %d is %q, not the guest", c.PID, cmd)
		}
	}
	const grace = time.Second
	t0 := time.Now()
	if err := c.Stop(context.Background(), grace); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < grace || d > grace*3/2 {
		t.Fatalf("stop took %s, want one grace of %s", d, grace)
	}
	waitDone(t, c, time.Second)
	if err := c.Err(); err == nil || err.Error() != "signal: killed" {
		t.Fatalf("exit %v", err)
	}
	if m := GroupMembers(c.PID, false); len(m) != 0 || c.Alive() {
		t.Fatalf("members left: %v", m)
	}
	if b, _ := os.ReadFile(log); string(b) != "up\n" {
		t.Fatalf("log %q", b)
	}
}

// A direct guest that exits by itself is seen on Done with its status, and
// Stop then kills at once what it left in its group, TERM ignored.
func TestDirectChildExitAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	c, err := Spawn(StartOptions{Dir: dir, Direct: true, Cwd: dir,
		Argv: []string{"/bin/sh", "-c", "(trap '' TERM; sleep 600) & sleep 0.1; exit 3"}})
	if err != nil {
		t.Fatal(err)
	}
	waitDone(t, c, 5*time.Second)
	if err := c.Err(); err == nil || err.Error() != "exit status 3" {
		t.Fatalf("exit %v", err)
	}
	if len(GroupMembers(c.PID, false)) == 0 {
		t.Fatal("the leftover is not in the group")
	}
	t0 := time.Now()
	if err := c.Stop(context.Background(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Fatalf("leftovers stopped after %s, want at once", d)
	}
	if m := GroupMembers(c.PID, false); len(m) != 0 {
		t.Fatalf("members left: %v", m)
	}
	if _, _, ok := Exit(dir); ok {
		t.Fatal("a direct guest has an exit file")
	}
}

// ParentDeathSignal reaches the guest when the thread that started it ends.
func TestParentDeathSignal(t *testing.T) {
	dir := t.TempDir()
	started := make(chan *Child, 1)
	var start func()
	start = func() {
		// Locked and never unlocked: the thread ends with the goroutine. But the runtime
		// never ends the main thread (a goroutine that exits locked to it wedges it), so a
		// goroutine that got it holds it and starts the guest from another.
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			done := make(chan struct{})
			go func() { start(); close(done) }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		c, err := Spawn(StartOptions{Dir: dir, Direct: true, Cwd: dir, Argv: []string{"/bin/sleep", "600"}, ParentDeathSignal: syscall.SIGTERM})
		if err != nil {
			t.Error(err)
		}
		started <- c
	}
	go start()
	c := <-started
	if c == nil {
		return
	}
	t.Cleanup(func() { _ = c.Stop(context.Background(), time.Second) })
	waitDone(t, c, 5*time.Second)
	if err := c.Err(); err == nil || err.Error() != "signal: terminated" {
		t.Fatalf("exit %v", err)
	}
}

// ReapStale stops the group a pid file records while its leader runs, and
// leaves alone a process that only has the recorded pid.
func TestReapStale(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "cp.pid")
	if _, found, err := ReapStale(context.Background(), pidFile, time.Second); found || err != nil {
		t.Fatalf("no pid file: found %v, %v", found, err)
	}
	c, err := Spawn(StartOptions{Dir: dir, PidFile: pidFile, Direct: true, Cwd: dir, Argv: []string{"/bin/sh", "-c", "sleep 600 & wait"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background(), time.Second) })

	// The same pid, started at another time: someone else's process.
	other := c.Record
	other.StartTicks++
	if err := WriteJSON(pidFile, other); err != nil {
		t.Fatal(err)
	}
	if _, found, err := ReapStale(context.Background(), pidFile, time.Second); found || err != nil || !c.Alive() {
		t.Fatalf("a reused pid: found %v, %v; alive %v", found, err, c.Alive())
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatalf("the pid file of a gone guest is kept: %v", err)
	}

	if err := WriteJSON(pidFile, c.Record); err != nil {
		t.Fatal(err)
	}
	rec, found, err := ReapStale(context.Background(), pidFile, time.Second)
	if err != nil || !found || rec != c.Record {
		t.Fatalf("ReapStale = %+v, %v, %v; want %+v", rec, found, err, c.Record)
	}
	waitDone(t, c, time.Second)
	if m := GroupMembers(c.PID, false); len(m) != 0 {
		t.Fatalf("members left: %v", m)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Fatalf("pid file kept: %v", err)
	}
}

// A group left with only a zombie that another process (not this one, not a member) would
// have to reap, as a guest adopted from a bidder that died is reaped by init: the zombie is
// dead, and KillGroup does not wait for a reaping that may take seconds.
func TestKillGroupDoesNotWaitForAnotherParentsZombie(t *testing.T) {
	// The parent starts a child in a session (and group) of its own, then becomes a sleep
	// that never reaps it.
	parent := exec.Command("/bin/sh", "-c", `setsid /bin/sh -c 'exit 0' & exec sleep 30`)
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = parent.Process.Kill(); _ = parent.Wait() })
	var zombie int
	for end := time.Now().Add(5 * time.Second); zombie == 0; {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", parent.Process.Pid, parent.Process.Pid))
		for _, f := range strings.Fields(string(b)) {
			if st, err := ReadStat(atoi(t, f)); err == nil && st.State == 'Z' && st.PGID == st.PID {
				zombie = st.PID
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no zombie child of %d in a group of its own: %q", parent.Process.Pid, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t0 := time.Now()
	if err := KillGroup(context.Background(), zombie, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("KillGroup took %s for a group whose only member is another parent's zombie", d)
	}
	if len(GroupMembers(zombie, true)) != 1 {
		t.Fatalf("the zombie is gone: the row proves nothing")
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}
