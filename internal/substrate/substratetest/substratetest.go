// Package substratetest holds test helpers shared by the substrate tests:
// prerequisite gating (skip locally, fail under CI=true) and counting the
// host processes of a state dir through /proc.
package substratetest

import (
	"bytes"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
)

// Require skips the test when ok is false, unless CI is "true", where a
// missing prerequisite is a failure (CI installs them with hack/ scripts).
func Require(t testing.TB, ok bool, what, hint string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing under CI=true: %s (%s)", what, hint)
	}
	t.Skipf("prerequisite missing: %s (%s)", what, hint)
}

// Procs lists the pids of live (non-zombie) host processes whose command
// line or working directory mentions dir: every guest process of a state
// dir does (the supervisor has the guest dir in its argv, the guest its
// program or kernel path).
func Procs(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && len(stat) > i+2 && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		cwd, _ := os.Readlink("/proc/" + e.Name() + "/cwd")
		if bytes.Contains(cmd, []byte(dir)) || strings.HasPrefix(cwd, dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Cleanup registers a check that runs after the test: every guest of s is
// stopped, and then no process of stateDir may be left.
func Cleanup(t *testing.T, s substrate.Substrate, stateDir string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		gs, err := s.List(ctx)
		if err != nil {
			t.Errorf("list: %v", err)
		}
		for _, g := range gs {
			if err := s.Stop(ctx, g.ID); err != nil {
				t.Errorf("stop %s: %v", g.ID, err)
			}
		}
		if pids := Procs(stateDir); len(pids) != 0 {
			t.Errorf("guest processes left after the test: %v", pids)
		}
	})
}

// Listener opens a loopback listener that a guest must not reach: its port, and a channel
// that receives once if anything connected to it. It closes when the test ends.
func Listener(t *testing.T) (port int, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	ch := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
			ch <- struct{}{}
		}
	}()
	return l.Addr().(*net.TCPAddr).Port, ch
}
