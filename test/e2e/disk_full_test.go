package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/testenv"
)

// smallFS mounts a tmpfs of mib MiB for the test and returns its path; it is unmounted
// (lazily: a process of the test may still hold it) when the test ends.
func smallFS(t *testing.T, mib int) string {
	t.Helper()
	requireTool(t, "mount")
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm,mode=0700", mib), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (%v): %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file into dir until its file system has no room left.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			return
		}
	}
}

// A data dir whose file system has no room for the store: up ends at once with one line
// naming the path, what is free and what the store needs, exit status 1, and no stack
// trace (etcd used to panic creating its write-ahead log).
func TestCLI_DataDirWithoutRoomIsOneLine(t *testing.T) {
	fs := smallFS(t, 12)
	data := filepath.Join(fs, "data")
	out, code := runCLI(t, "up", "--data-dir", data)
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, out)
	}
	if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
		t.Fatalf("a stack trace instead of one line:\n%s", out)
	}
	var last string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(l, "socialweb: ") {
			last = l
		}
	}
	if !strings.Contains(last, data) || !strings.Contains(last, "free") || !strings.Contains(last, "needs at least") {
		t.Fatalf("the error line %q does not name the data dir, its room and the need:\n%s", last, out)
	}
}

// While up runs, its data dir's file system running low is said on its progress output
// before anything fails, and a store that then finds no room at all ends the process with
// one line naming its directory and why, exit status 1, no stack trace.
func TestCLI_DataDirRunningOutIsSaidThenOneLine(t *testing.T) {
	fs := smallFS(t, 400)
	data := filepath.Join(fs, "data")
	p := startUp(t, data)
	warning := p.line(t, "under 512 MiB")
	if !strings.Contains(warning, data) || !strings.Contains(warning, "free") {
		t.Fatalf("the warning %q does not name the data dir and its room", warning)
	}
	fill(t, fs)
	// Writes until the store cannot: Secrets of 128 KiB each (create: apply would copy the
	// object into an annotation, which is limited to 256 KiB).
	payload := strings.Repeat("x", 128<<10)
	var exited error
	testenv.Eventually(t, 3*time.Minute, "up to end when its store has no room", func() (bool, error) {
		select {
		case exited = <-p.done:
			return true, nil
		default:
		}
		for i := range 8 {
			name := fmt.Sprintf("s%d-%d", time.Now().UnixNano(), i)
			_, _ = kubectlRun(data, fmt.Sprintf("apiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: default\nstringData:\n  v: %s\n",
				name, payload), "create", "-f", "-")
		}
		return false, nil
	})
	ee, ok := exited.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 {
		t.Fatalf("up ended with %v, want exit status 1", exited)
	}
	p.mu.Lock()
	lines := strings.Join(p.phases, "\n")
	p.mu.Unlock()
	if strings.Contains(lines, "panic:") || strings.Contains(lines, "goroutine ") {
		t.Fatalf("a stack trace instead of one line:\n%s", lines)
	}
	if !strings.Contains(lines, "socialweb: the store in "+filepath.Join(data, "etcd")) {
		t.Fatalf("no line names the store's directory and why it stopped:\n%s", lines)
	}
}
