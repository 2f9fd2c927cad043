package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// Built once per run as hack/build.sh builds it: the Kubernetes version stamped in (the
	// tenant rows check it), the deno guests' small jail init and the node runtime (containerd
	// v2, runc) beside it, where they are looked for first. The first build compiles
	// k8s.io/kubernetes (minutes, cached after).
	build := exec.Command("bash", "../../hack/build.sh", socialwebBin)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "hack/build.sh:", err)
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
