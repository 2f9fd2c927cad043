package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestChooseRuntime(t *testing.T) {
	// bin/socialweb with a full node-runtime beside it; other/socialweb with one lacking runc.
	root := t.TempDir()
	full := filepath.Join(root, "bin", RuntimeDirName)
	partial := filepath.Join(root, "other", RuntimeDirName)
	for dir, names := range map[string][]string{full: runtimeBinaries, partial: {"containerd", "containerd-shim-runc-v2", "ctr"}} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name, configured, binary  string
		wantDir, wantWhy, wantErr string
	}{
		{name: "beside the binary", binary: filepath.Join(root, "bin", "socialweb"), wantDir: full, wantWhy: "built beside"},
		{name: "nothing beside: the host's", binary: filepath.Join(root, "socialweb"), wantWhy: "the host's on PATH"},
		{name: "one missing beside: the host's", binary: filepath.Join(root, "other", "socialweb"), wantWhy: "has no runc"},
		{name: "configured", configured: full, binary: "/nowhere/socialweb", wantDir: full, wantWhy: "configured"},
		{name: "configured host", configured: HostRuntime, binary: filepath.Join(root, "bin", "socialweb"), wantWhy: "configured: the host's"},
		{name: "configured, one missing: refused", configured: partial, wantErr: "runc is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := chooseRuntime(tc.configured, tc.binary)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rt.Dir != tc.wantDir || !strings.Contains(rt.Why, tc.wantWhy) {
				t.Fatalf("got %+v, want dir %q and why containing %q", rt, tc.wantDir, tc.wantWhy)
			}
			if rt.UserNamespaces() != (tc.wantDir != "") {
				t.Fatalf("UserNamespaces %v with dir %q", rt.UserNamespaces(), rt.Dir)
			}
		})
	}
}

func TestContainerdConfigVersion(t *testing.T) {
	ns := nodeState{Dir: "/g", RunDir: "/r"}
	if c := containerdConfig(ns); !strings.HasPrefix(c, "version = 2\n") {
		t.Fatalf("the host's containerd (1.6) reads version 2:\n%s", c)
	}
	ns.Runtime = nodeRuntime{Dir: "/rt"}
	c := containerdConfig(ns)
	for _, want := range []string{"version = 3\n", `runtime_path = "/rt/containerd-shim-runc-v2"`, `BinaryName = "/rt/runc"`, `sandbox = "` + PauseImage + `"`, "SystemdCgroup = false", `config_path = "/g/work/containerd/certs.d"`} {
		if !strings.Contains(c, want) {
			t.Errorf("containerd v2 config lacks %s:\n%s", want, c)
		}
	}
}
