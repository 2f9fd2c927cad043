package image

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
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

	// The node modules' order, from the real modules' .modinfo: nf_tables after nfnetlink
	// (its dependency, named nowhere in NodeModules), virtio_blk's virtio left to init.
	files := initrdFiles(t, im.Initrd)
	order := strings.Fields(string(files[NodeModuleOrderFile]))
	t.Logf("node modules: %v", order)
	at := func(m string) int { return slices.Index(order, m) }
	if at("nfnetlink") < 0 || at("nf_tables") < at("nfnetlink") || at("nft_ct") < at("nf_conntrack") || at("br_netfilter") < at("bridge") {
		t.Errorf("node modules out of dependency order: %v", order)
	}
	if at("virtio") >= 0 || at("virtio_ring") >= 0 {
		t.Errorf("node modules reload what init loads: %v", order)
	}
	for _, m := range append(slices.Clone(NetModules), order...) {
		if _, ok := files["lib/modules/"+m+".ko"]; !ok {
			t.Errorf("the initrd lacks lib/modules/%s.ko", m)
		}
	}
}

// initrdFiles reads a gzip'd newc archive: each regular file's contents by name.
func initrdFiles(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	pad := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; off+110 <= len(raw); {
		field := func(i int) int {
			v, err := strconv.ParseUint(string(raw[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("newc header at %d: %v", off, err)
			}
			return int(v)
		}
		mode, size, nameSize := field(1), field(6), field(11)
		name := string(raw[off+110 : off+110+nameSize-1])
		data := pad(off + 110 + nameSize)
		if name == "TRAILER!!!" {
			break
		}
		if mode&0o170000 == 0o100000 {
			files[name] = raw[data : data+size]
		}
		off = pad(data + size)
	}
	return files
}
