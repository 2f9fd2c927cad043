package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testBusybox is the userland's busybox, built once into the repository's cache (later
// runs take it from there). The test is skipped when it cannot be built here: no compiler,
// no way to the source, or too little of the test's time left for a cold build.
func testBusybox(t *testing.T) string {
	t.Helper()
	cache, err := filepath.Abs(filepath.Join("..", "..", cacheDir))
	if err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(cache, "busybox", busyboxKey(), "busybox")) {
		if err := busyboxBuildTools(); err != nil {
			t.Skipf("busybox %s is not built in %s and cannot be built here: %v", busyboxVersion, cache, err)
		}
		if d, ok := t.Deadline(); ok && time.Until(d) < 6*time.Minute {
			t.Skipf("busybox %s is not built in %s yet and a cold build takes minutes: run once with -timeout 30m", busyboxVersion, cache)
		}
	}
	bin, err := buildBusybox(context.Background(), cache)
	var unreachable *busyboxFetchError
	if errors.As(err, &unreachable) {
		t.Skipf("busybox %s cannot be built here: %v", busyboxVersion, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// shAt makes a link named sh to busybox in a new directory, so that busybox runs as sh
// (it picks the applet by its argv[0]'s name) as the image's /bin/sh does.
func shAt(t *testing.T, busybox string) string {
	t.Helper()
	sh := filepath.Join(t.TempDir(), "sh")
	if err := os.Symlink(busybox, sh); err != nil {
		t.Fatal(err)
	}
	return sh
}

// The image's /bin/sh behaves as upstream's busybox ash, where the specs depend on it.
func TestBusyboxShell(t *testing.T) {
	busybox := testBusybox(t)
	sh := shAt(t, busybox)

	// The read-only-root spec runs `/bin/sh -c "echo test > /file; sleep 240"` with a
	// read-only root and expects this message in the container's log, word for word.
	t.Run("read-only root message", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root (a mount namespace with / read-only)")
		}
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skip("needs util-linux's unshare")
		}
		// / is remounted read-only in a private mount namespace of this command alone; the
		// shell starts only when that took.
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "bash", "-c",
			`mount -o remount,bind,ro / || exit 99; exec -a /bin/sh "$0" -c 'echo x > /file'`, sh)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 99 {
			t.Skipf("cannot remount / read-only in a mount namespace here: %s", stderr.String())
		}
		if err == nil {
			t.Errorf("echo x > /file on a read-only root succeeded")
		}
		if want := "/bin/sh: can't create /file: Read-only file system\n"; stderr.String() != want {
			t.Errorf("stderr %q, want %q (stdout %q)", stderr.String(), want, stdout.String())
		}
	})

	// envFrom sets names that are not shell names; the ConfigMap and Secret env specs read
	// them back with `sh -c env`.
	t.Run("passes on variables that are not shell names", func(t *testing.T) {
		cmd := exec.Command(sh, "-c", "env")
		cmd.Env = []string{"PATH=/usr/bin:/bin", "data-1=value-1", "p.data-1=value-1"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("sh -c env: %v\n%s", err, out)
		}
		lines := strings.Split(string(out), "\n")
		for _, want := range []string{"data-1=value-1", "p.data-1=value-1"} {
			if !contains(lines, want) {
				t.Errorf("sh -c env does not pass on %s:\n%s", want, out)
			}
		}
	})

	// Specs run `sh -c "nc -v -t -w 2 IP PORT"` and the like: the image's nc (in /usr/bin)
	// must be the one run, not busybox's applet of the same name.
	t.Run("finds programs through PATH before applets", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "nc"), []byte("#!/bin/sh\necho nc-from-path\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(sh, "-c", "nc")
		cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || got != "nc-from-path" {
			t.Errorf("sh -c nc with %s first in PATH: %q (%v), want the program there to run", dir, got, err)
		}
	})
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

func TestSetBusyboxConfig(t *testing.T) {
	defconfig := "# comment\n# CONFIG_STATIC is not set\nCONFIG_TC=y\nCONFIG_TCPSVD=y\n"
	got, err := setBusyboxConfig([]byte(defconfig), []busyboxOption{{"CONFIG_STATIC", "y"}, {"CONFIG_TC", ""}})
	if err != nil {
		t.Fatal(err)
	}
	want := "# comment\nCONFIG_STATIC=y\n# CONFIG_TC is not set\nCONFIG_TCPSVD=y\n"
	if string(got) != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if err := checkBusyboxConfig(got, []busyboxOption{{"CONFIG_STATIC", "y"}, {"CONFIG_TC", ""}}); err != nil {
		t.Error(err)
	}
	if err := checkBusyboxConfig([]byte(defconfig), []busyboxOption{{"CONFIG_STATIC", "y"}}); err == nil {
		t.Error("checkBusyboxConfig took a .config without CONFIG_STATIC=y")
	}
	if _, err := setBusyboxConfig([]byte(defconfig), []busyboxOption{{"CONFIG_RENAMED", "y"}}); err == nil {
		t.Error("setBusyboxConfig took an option the .config does not have")
	}
}

func TestFetchSHA256(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/tarball" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("hello\n"))
	}))
	defer srv.Close()
	var b strings.Builder
	got, err := fetchSHA256(context.Background(), srv.URL+"/tarball", &b)
	if err != nil || b.String() != "hello\n" || got != "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03" {
		t.Errorf("fetchSHA256: %q, %q, %v", got, b.String(), err)
	}
	if _, err := fetchSHA256(context.Background(), srv.URL+"/missing", io.Discard); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("fetchSHA256 of a missing file: %v, want a 404", err)
	}
}
