package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"socialweb.computer/internal/substrate/substratetest"
)

func TestArchiveNewc(t *testing.T) {
	ar := NewArchive()
	ar.Add(Entry{Name: "a/b/file", Kind: File, Mode: 0o640, Data: []byte("hello")})
	ar.Add(Entry{Name: "bin/sh", Kind: Symlink, Link: "/bin/busybox"})
	ar.Add(Entry{Name: "dev/console", Kind: CharDev, Mode: 0o600, DevMajor: 5, DevMinor: 1})
	var b bytes.Buffer
	if err := ar.WriteGzip(&b); err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(&b)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(zr)
	if len(raw)%4 != 0 || !bytes.HasPrefix(raw, []byte("070701")) || !bytes.Contains(raw, []byte("TRAILER!!!\x00")) {
		t.Fatalf("not a newc archive: %q", raw[:min(len(raw), 120)])
	}
	// Parents first, then their children, in order.
	for _, n := range []string{"a\x00", "a/b\x00", "a/b/file\x00", "bin\x00", "bin/sh\x00", "dev/console\x00"} {
		if !bytes.Contains(raw, []byte(n)) {
			t.Fatalf("missing %q", n)
		}
	}
	if bytes.Index(raw, []byte("a/b\x00")) > bytes.Index(raw, []byte("a/b/file\x00")) {
		t.Fatal("parent after child")
	}
	// When a cpio is installed, it must read the archive back.
	if _, err := exec.LookPath("cpio"); err == nil {
		cmd := exec.Command("cpio", "-t", "--quiet")
		cmd.Stdin = bytes.NewReader(raw)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "a/b/file") || !strings.Contains(string(out), "dev/console") {
			t.Fatalf("cpio -t: %s", out)
		}
	}
}

// TestBuildImage builds the real image into a temp dir (downloads two
// Debian packages, ~28 MB). Set SOCIALWEB_IMAGE_OUT to keep it somewhere.
func TestBuildImage(t *testing.T) {
	substratetest.Require(t, len(Prerequisites()) == 0, "apt-get, apt-cache, dpkg-deb", "a Debian host")
	if testing.Short() {
		t.Skip("downloads the kernel package")
	}
	out := os.Getenv("SOCIALWEB_IMAGE_OUT")
	if out == "" {
		out = t.TempDir()
	}
	var progress bytes.Buffer
	if err := BuildImage(context.Background(), out, &progress); err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	t.Logf("%s", progress.String())
	for _, want := range []string{"[1/5] resolve", "[2/5] download", "[5/5] write: done", "image: kernel"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	im, err := Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if im.PVHKernel == "" {
		t.Errorf("no PVH kernel extracted:\n%s", progress.String())
	}
	if !strings.HasSuffix(im.Manifest.KernelRelease, "-cloud-amd64") || im.Manifest.BusyboxVersion == "" {
		t.Fatalf("manifest %+v", im.Manifest)
	}
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("scratch left behind: %s", e.Name())
		}
	}
}
