package tenant

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
)

// fakeControlPlane stands for `socialweb kube controlplane`: it logs a line and waits on a
// child of its own, in its process group; both end on SIGTERM.
func fakeControlPlane(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "socialweb")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho serving \"$@\"\nsleep 600 &\nwait\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	return bin
}

func fakeManager(t *testing.T, root, bin string) *Manager {
	t.Helper()
	m, err := NewManager(Config{Root: root, Binary: bin, Advertise: net.IPv4(10, 77, 0, 1), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// groupLeft lists the live members of process group pgid, after giving them up to d to go.
func groupLeft(pgid int, d time.Duration) []int {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if m := guestproc.GroupMembers(pgid, false); len(m) == 0 || time.Now().After(end) {
			return m
		}
	}
}

// waitFor polls the manager's status of k until ok says yes.
func waitFor(t *testing.T, m *Manager, k Key, what string, ok func(Status) bool) Status {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s := m.Status(k)
		if ok(s) {
			return s
		}
		if time.Now().After(end) {
			t.Fatalf("%s: status %+v", what, s)
		}
	}
}

// A control plane left running by a manager that ended without stopping it (its process
// killed) is found by the next manager on the same root, and its whole process group
// stopped, before that manager starts its own.
func TestStaleControlPlaneIsStopped(t *testing.T) {
	root, bin := t.TempDir(), fakeControlPlane(t)
	k := Key{Namespace: "acct-x", Name: "web"}
	old := fakeManager(t, root, bin)
	in, err := old.ensure(k, old.policy(StartOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := old.spawn(in)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stale.Stop(context.Background(), time.Second) })
	if len(groupMembersSoon(stale.PID, 2)) < 2 {
		t.Fatalf("the control plane's child is not in its group: %v", guestproc.GroupMembers(stale.PID, false))
	}
	// The old manager's process is gone: its listeners with it, its child left behind.
	in.gate.Close()
	in.egress.close()

	m := fakeManager(t, root, bin)
	t.Cleanup(m.Shutdown)
	if _, err := m.Start(k, StartOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stale.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the stale control plane still runs")
	}
	if left := groupLeft(stale.PID, 2*time.Second); len(left) != 0 {
		t.Fatalf("the stale control plane's group is left: %v", left)
	}
	s := waitFor(t, m, k, "the new manager's own control plane", func(s Status) bool { return s.PID != 0 })
	if s.PID == stale.PID || s.State != StateStarting {
		t.Fatalf("status %+v after the stale %d", s, stale.PID)
	}
}

// groupMembersSoon waits until group pgid has n live members.
func groupMembersSoon(pgid, n int) []int {
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := guestproc.GroupMembers(pgid, false); len(m) >= n || time.Now().After(end) {
			return m
		}
	}
}

// A control plane that dies is reported Crashed with how it ended and restarted after the
// backoff; Stop ends its whole process group.
func TestControlPlaneRestartsAfterACrashAndStops(t *testing.T) {
	root, bin := t.TempDir(), fakeControlPlane(t)
	k := Key{Namespace: "acct-x", Name: "web"}
	m := fakeManager(t, root, bin)
	t.Cleanup(m.Shutdown)
	if _, err := m.Start(k, StartOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitFor(t, m, k, "started", func(s Status) bool { return s.PID != 0 })
	var rec guestproc.Record
	if err := guestproc.ReadJSON(m.Layout(k).PIDFile(), &rec); err != nil || rec.PID != first.PID || !rec.Alive() {
		t.Fatalf("pid file %+v (%v), status pid %d", rec, err, first.PID)
	}
	if !strings.HasSuffix(first.Instance, "-"+strconv.Itoa(first.PID)) {
		t.Fatalf("instance %q does not name pid %d", first.Instance, first.PID)
	}
	groupMembersSoon(first.PID, 2)
	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	crashed := waitFor(t, m, k, "crashed", func(s Status) bool { return s.State == StateCrashed })
	if crashed.Restarts != 1 || !strings.Contains(crashed.LastExit, "signal: killed: serving kube controlplane --spec") {
		t.Fatalf("crash reported as %+v", crashed)
	}
	if left := groupLeft(first.PID, 2*time.Second); len(left) != 0 {
		t.Fatalf("the crashed control plane's group is left: %v", left)
	}
	t0 := time.Now()
	second := waitFor(t, m, k, "restarted", func(s Status) bool { return s.PID != 0 && s.PID != first.PID })
	if d := time.Since(t0); d < 500*time.Millisecond {
		t.Fatalf("restarted after %s, before the backoff", d)
	}
	groupMembersSoon(second.PID, 2)
	if err := m.Stop(k); err != nil {
		t.Fatal(err)
	}
	if s := m.Status(k); s.State != StateStopped || s.PID != 0 {
		t.Fatalf("after Stop: %+v", s)
	}
	if left := groupLeft(second.PID, 2*time.Second); len(left) != 0 {
		t.Fatalf("Stop left the group: %v", left)
	}
}
