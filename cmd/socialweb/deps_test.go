package main

import (
	"os/exec"
	"path"
	"strings"
	"testing"
)

// harnessPackage says whether pkg is one of this module's test harnesses: the in-process core
// of the end-to-end rows (internal/testenv), the rows themselves and their helpers (test/...),
// and the helpers named, as net/http/httptest is, after what they help test (lextest,
// substratetest, vmtest).
func harnessPackage(pkg string) bool {
	const module = "socialweb.computer/"
	rel, ours := strings.CutPrefix(pkg, module)
	if !ours {
		return false
	}
	return rel == "internal/testenv" || rel == "test" || strings.HasPrefix(rel, "test/") || strings.HasSuffix(path.Base(rel), "test")
}

// The binary users run carries no test harness: bench builds its stack as up does.
func TestBinaryLinksNoTestHarness(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to list the binary's packages: %v", err)
	}
	out, err := exec.Command(goCmd, "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if harnessPackage(pkg) {
			t.Errorf("socialweb links %s, a test harness", pkg)
		}
	}
}

func TestHarnessPackage(t *testing.T) {
	for pkg, want := range map[string]bool{
		"socialweb.computer/internal/testenv":                 true,
		"socialweb.computer/test/e2e/svcprobe":                true,
		"socialweb.computer/internal/substrate/substratetest": true,
		"socialweb.computer/internal/bench":                   false,
		"socialweb.computer/internal/app":                     false,
		"k8s.io/component-base/metrics/testutil":              false, // not this module's
	} {
		if got := harnessPackage(pkg); got != want {
			t.Errorf("harnessPackage(%s) = %v, want %v", pkg, got, want)
		}
	}
}
