package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"socialweb.computer/internal/substrate/jail"
)

// socialwebBin is the binary under test, built once per run.
var socialwebBin string

func TestMain(m *testing.M) {
	// The deno substrates the rows start in this process jail their guests with this binary.
	jail.MaybeRun()
	// The test command builds the binary once for every package that runs it.
	if bin := os.Getenv("SOCIALWEB_TEST_BIN"); bin != "" {
		socialwebBin = bin
		code := m.Run()
		removeBuilt()
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "socialweb-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	socialwebBin = filepath.Join(dir, "socialweb")
	// Built once per run, with the Kubernetes version stamped in as hack/build.sh does (the
	// tenant rows check it): the first build compiles k8s.io/kubernetes (minutes, cached after).
	ldflags, err := exec.Command("bash", "../../hack/kube-ldflags.sh").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "hack/kube-ldflags.sh:", err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-ldflags", strings.TrimSpace(string(ldflags)), "-o", socialwebBin, "socialweb.computer/cmd/socialweb")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building socialweb:", err)
		os.Exit(1)
	}
	// The node runtime (containerd v2, runc) beside it, where nodes look for it first.
	rt := exec.Command("bash", "../../hack/build-node-runtime.sh", filepath.Join(dir, "node-runtime"))
	rt.Stdout, rt.Stderr = os.Stderr, os.Stderr
	if err := rt.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the node runtime:", err)
		os.Exit(1)
	}
	code := m.Run()
	removeBuilt()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireTool returns the path of a tool the row needs. Under CI a missing tool fails the
// row: CI installs what the tests need, and a skip there would read as a pass.
func requireTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed; .ci/run must install it", name)
		}
		t.Skipf("%s is not installed", name)
	}
	return p
}
