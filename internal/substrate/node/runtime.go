package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// RuntimeDirName is the node runtime's dir beside the socialweb binary
// (hack/build-node-runtime.sh: containerd v2 and runc built from source).
const RuntimeDirName = "node-runtime"

// LabelUserNamespaces is "true" on the Node of a node whose runtime runs pods with
// hostUsers: false (the node runtime); absent on the others, which refuse such pods.
const LabelUserNamespaces = "socialweb.computer/user-namespaces"

// HostRuntime as Config.RuntimeDir takes the host's containerd and runc on PATH even when
// a node runtime is beside the binary.
const HostRuntime = "host"

// runtimeBinaries are what a node runtime dir must hold, all of them.
var runtimeBinaries = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr"}

// nodeRuntime is where a node's containerd, its runc shim, runc and ctr are. Dir empty: the
// host's, by name on PATH (Debian's containerd 1.6 and runc 1.1: no user namespaces for
// pods; a node booted before the node runtime has this too).
type nodeRuntime struct {
	Dir string `json:"dir,omitempty"`
	// Why says where Dir came from, for the agent's log.
	Why string `json:"why,omitempty"`
}

// path is the binary name of the runtime: in Dir, or the bare name for PATH.
func (r nodeRuntime) path(name string) string {
	if r.Dir == "" {
		return name
	}
	return filepath.Join(r.Dir, name)
}

// UserNamespaces: containerd >= 2.0 and runc >= 1.2 run pods with hostUsers: false; the
// host's Debian ones do not.
func (r nodeRuntime) UserNamespaces() bool { return r.Dir != "" }

// chooseRuntime decides the node runtime: configured (it must hold every binary), else
// node-runtime beside the binary when it holds every one, else the host's on PATH.
func chooseRuntime(configured, binary string) (nodeRuntime, error) {
	if configured == HostRuntime {
		return nodeRuntime{Why: "configured: the host's on PATH (pods cannot run with hostUsers: false)"}, nil
	}
	if configured != "" {
		abs, err := filepath.Abs(configured)
		if err != nil {
			return nodeRuntime{}, err
		}
		if missing := missingRuntime(abs); missing != "" {
			return nodeRuntime{}, fmt.Errorf("node runtime %s: %s is missing (hack/build-node-runtime.sh builds it)", abs, missing)
		}
		return nodeRuntime{Dir: abs, Why: "configured"}, nil
	}
	beside := filepath.Join(filepath.Dir(binary), RuntimeDirName)
	if missing := missingRuntime(beside); missing != "" {
		return nodeRuntime{Why: fmt.Sprintf("the host's on PATH: %s has no %s (pods cannot run with hostUsers: false)", beside, missing)}, nil
	}
	return nodeRuntime{Dir: beside, Why: "built beside " + binary}, nil
}

// missingRuntime names the first runtime binary dir lacks (not an executable file), or "".
func missingRuntime(dir string) string {
	for _, b := range runtimeBinaries {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return b
		}
	}
	return ""
}

// runtimeFiles are the runtime's binaries, for a node's root: at their host paths.
func (r nodeRuntime) files() ([][2]string, error) {
	var files [][2]string
	for _, b := range runtimeBinaries {
		p := r.path(b)
		if r.Dir == "" {
			var err error
			if p, err = exec.LookPath(b); err != nil {
				return nil, fmt.Errorf("%s: %w", b, err)
			}
		}
		files = append(files, [2]string{p, p})
	}
	return files, nil
}
