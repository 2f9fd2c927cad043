package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"socialweb.computer/internal/ociimage"
	"socialweb.computer/internal/testenv"
)

// imageProbe is the program the row puts in the image in place of socialweb (a static
// build of which takes minutes): it says who it runs as, what it sees, and whether it can
// write its root filesystem.
const imageProbe = `package main

import (
	"fmt"
	"os"
)

func main() {
	ca, err := os.ReadFile(os.Getenv("SSL_CERT_FILE"))
	write := os.WriteFile("/probe-write", []byte("x"), 0o644)
	fmt.Printf("uid=%d gid=%d argv=%q ca=%d-bytes-%v write-refused=%v\n", os.Getuid(), os.Getgid(), os.Args, len(ca), err == nil, write != nil)
}
`

// TestImage_TarballImportsAndRunsInNodeContainerd: hack/image's tarball is imported the way a
// node imports its image dir (ctr -n k8s.io images import, with the node runtime's containerd
// and ctr), under its name, and runs from it on a read-only root filesystem as 65532 with the
// CA bundle at SSL_CERT_FILE.
func TestImage_TarballImportsAndRunsInNodeContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("containerd runs as root")
	}
	rt := filepath.Join(filepath.Dir(socialwebBin), "node-runtime")
	for _, b := range []string{"containerd", "ctr", "runc", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(rt, b)); err != nil {
			t.Fatalf("node runtime beside the binary (hack/build.sh builds it): %v", err)
		}
	}
	ca := "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(ca); err != nil {
		t.Skipf("no CA bundle: %v", err)
	}
	dir := t.TempDir()

	// The payload: a static program (the image has no libc).
	src := filepath.Join(dir, "probe")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(src, "go.mod"), []byte("module probe\n\ngo 1.26\n"), 0o644)
	_ = os.WriteFile(filepath.Join(src, "main.go"), []byte(imageProbe), 0o644)
	probe := filepath.Join(dir, "probe.bin")
	build := exec.Command("go", "build", "-o", probe, ".")
	build.Dir, build.Env = src, append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the probe: %v\n%s", err, out)
	}

	// The tarball, by the command hack/image.sh runs.
	tarPath := filepath.Join(dir, "images", "socialweb.tar")
	img := exec.Command("go", "run", "./hack/image", "--binary", probe, "--ca", ca, "--version", "v0.0.0-e2e", "--out", tarPath)
	img.Dir = "../.."
	out, err := img.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/image: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), ociimage.Name) {
		t.Errorf("hack/image says %q, want the image's name", out)
	}

	// A containerd of the node runtime, on a state of its own and a unix socket only.
	sock := filepath.Join(dir, "containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  address = ""

[metrics]
  address = ""
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	_ = os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600)
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cd := exec.Command(filepath.Join(rt, "containerd"), "--config", filepath.Join(dir, "config.toml"))
	// The shim looks runc up by name: the node runtime's, as on a node.
	cd.Env = append(os.Environ(), "PATH="+rt+":"+os.Getenv("PATH"))
	cd.Stdout, cd.Stderr = logf, logf
	cd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Logf("containerd.log:\n%s", b)
		}
	}()
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, filepath.Join(rt, "ctr"), append([]string{"--address", sock, "-n", "k8s.io"}, args...)...)
		c.Env = cd.Env
		out, err := c.CombinedOutput()
		return string(out), err
	}
	testenv.Eventually(t, 15*time.Second, "containerd answers", func() (bool, error) {
		_, err := ctr("version")
		return err == nil, nil
	})

	// What the node agent runs for each tarball of its image dir.
	if out, err := ctr("images", "import", tarPath); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	names, err := ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(names, ociimage.Name) {
		t.Fatalf("images after import: %v %q, want %s", err, names, ociimage.Name)
	}
	// Run it as a pod would with readOnlyRootFilesystem: the image's own entrypoint, user and
	// env (ctr run's arguments would replace the entrypoint, so none).
	run, err := ctr("run", "--rm", "--read-only", ociimage.Name, "probe-1")
	if err != nil {
		t.Fatalf("ctr run: %v\n%s", err, run)
	}
	want := fmt.Sprintf(`uid=65532 gid=65532 argv=["/socialweb"] ca=%d-bytes-true write-refused=true`, fileSize(t, ca))
	got := "" // the probe's line; ctr's own warnings share the output
	for _, l := range strings.Split(run, "\n") {
		if strings.HasPrefix(l, "uid=") {
			got = l
		}
	}
	if got != want {
		t.Errorf("the image ran as\n  %s\nwant\n  %s", run, want)
	}
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
