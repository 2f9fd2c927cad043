package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The userland runs as the specs use it: `sh -c env` passes on every variable, `sh -c`
// finds the image's nc through PATH (not a busybox applet), nc takes -v -t -u -z -w, and
// every dynamic program finds its libraries.
// Run in a chroot of the unpacked layer.
func TestUserlandRunsTheSpecsCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot)")
	}
	l, err := userlandLayer(testBusybox(t))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode)&os.ModePerm)
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode)&os.ModePerm)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	run := func(script string) string {
		t.Helper()
		cmd := exec.Command("chroot", root, "/bin/sh", "-c", script)
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "data-1=value-1", "p.data-1=value-1"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("sh -c %q: %v\n%s", script, err, out)
		}
		return string(out)
	}
	// envFrom may set names that are not shell names; the ConfigMap and Secret specs read
	// them back with `sh -c env`.
	if out := run("env"); !strings.Contains(out, "\ndata-1=value-1") && !strings.HasPrefix(out, "data-1=value-1") || !strings.Contains(out, "p.data-1=value-1") {
		t.Errorf("sh -c env dropped the variables whose names are not shell names:\n%s", out)
	}
	if got := strings.TrimSpace(run("command -v nc")); got != "/usr/bin/nc" {
		t.Errorf("sh finds nc at %q, want /usr/bin/nc (the image's, through PATH)", got)
	}
	help := run("nc -h 2>&1 || true")
	for _, opt := range []string{"-v", "-t", "-u", "-z", "-w"} {
		if !strings.Contains(help, "\t"+opt) && !strings.Contains(help, " "+opt+" ") && !strings.Contains(help, "["+opt) {
			t.Errorf("nc has no %s:\n%s", opt, help)
		}
	}
	// Port 1 of loopback: refused at once, and nc says so with -v.
	if out := run("nc -v -z -w 2 127.0.0.1 1 2>&1 || true"); !strings.Contains(out, "refused") {
		t.Errorf("nc -v -z to a closed port: %q", out)
	}
	// Every program starts: no library missing, nothing not found.
	for _, prog := range []string{"dig -v", "nslookup -version", "host -V", "curl --version", "ls /", "wget --help", "cat /etc/passwd"} {
		out := run(prog + " 2>&1; echo rc=$?")
		if strings.Contains(out, "error while loading") || strings.Contains(out, "not found") || strings.Contains(out, "rc=127") {
			t.Errorf("%s: %s", prog, out)
		}
	}
	if out := run("id user-defined-in-image"); !strings.Contains(out, "50000(group-defined-in-image)") {
		t.Errorf("id user-defined-in-image: %q", out)
	}
}
