package kubeversion

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"k8s.io/component-base/version"
)

// A binary built as `go run` builds it, without hack/build.sh's -ldflags, reports the
// module's Kubernetes version (a test binary carries no module build info: build one).
func TestStampedFromBuildInfo(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", StagingModule).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", StagingModule, err)
	}
	want := "v1." + strings.TrimPrefix(strings.TrimSpace(string(out)), "v0.")
	bin := filepath.Join(t.TempDir(), "stampcheck")
	if out, err := exec.Command("go", "build", "-o", bin, "./testdata/stampcheck").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err = exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	minor := strings.Split(want, ".")[1]
	if got, exp := strings.Fields(string(out)), []string{want, "1", minor, want, "1", minor}; strings.Join(got, " ") != strings.Join(exp, " ") {
		t.Errorf("reported %q; want %q", got, exp)
	}
}

func TestFromBuildInfo(t *testing.T) {
	dep := func(path, v string) *debug.Module { return &debug.Module{Path: path, Version: v} }
	for _, c := range []struct {
		deps []*debug.Module
		want string
	}{
		{[]*debug.Module{dep(StagingModule, "v0.37.2"), dep(KubernetesModule, "v1.37.2")}, "v1.37.2"},
		{[]*debug.Module{dep(StagingModule, "v0.37.2")}, "v1.37.2"},
		{[]*debug.Module{{Path: KubernetesModule, Version: "v1.30.0", Replace: dep(KubernetesModule, "v1.37.1")}}, "v1.37.1"},
		{[]*debug.Module{dep("example.com/x", "v1.0.0")}, ""},
	} {
		if got := fromBuildInfo(&debug.BuildInfo{Deps: c.deps}); got != c.want {
			t.Errorf("fromBuildInfo(%v) = %q; want %q", c.deps, got, c.want)
		}
	}
}

func TestMajorMinor(t *testing.T) {
	for _, c := range []struct {
		in           string
		major, minor string
		ok           bool
	}{
		{"v1.37.2", "1", "37", true},
		{"v1.37.0-rc.1", "1", "37", true},
		{"v1.37.2+k3s1", "1", "37", true},
		{"v0.0.0-master+$Format:%H$", "0", "0", true},
		{"1.37.2", "", "", false},
		{"v1.37", "", "", false},
		{"vx.37.2", "", "", false},
		{"(devel)", "", "", false},
		{"", "", "", false},
	} {
		major, minor, ok := majorMinor(c.in)
		if major != c.major || minor != c.minor || ok != c.ok {
			t.Errorf("majorMinor(%q) = %q, %q, %v; want %q, %q, %v", c.in, major, minor, ok, c.major, c.minor, c.ok)
		}
	}
}

func TestLinkerStampKept(t *testing.T) {
	saved := baseGitVersion
	defer func() { baseGitVersion = saved; baseDynamicGitVersion.Store(saved) }()
	baseGitVersion = "v1.36.9"
	baseDynamicGitVersion.Store("v1.36.9")
	stamp("v1.37.2")
	if got := version.Get().GitVersion; got != "v1.36.9" {
		t.Errorf("a linker-set version was replaced: %q", got)
	}
}
