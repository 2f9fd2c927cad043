// Package kubeversion stamps the Kubernetes version into the Kubernetes code built into this
// binary when the linker did not (a plain `go build` or `go run`, without hack/build.sh's
// -ldflags): k8s.io/component-base/version and k8s.io/client-go/pkg/version then read
// "v0.0.0-master+$Format:%H$", which kubectl and client libraries refuse to parse from a
// tenant apiserver's /version. The version comes from the module's build info: the version
// of k8s.io/kubernetes this binary was built with. Import it for its side effect.
package kubeversion

import (
	"runtime/debug"
	"strings"
	"sync/atomic"
	_ "unsafe" // go:linkname

	// Initialized before this package, so init below overrides their defaults.
	_ "k8s.io/client-go/pkg/version"
	_ "k8s.io/component-base/version"
)

//go:linkname baseGitVersion k8s.io/component-base/version.gitVersion
var baseGitVersion string

//go:linkname baseGitMajor k8s.io/component-base/version.gitMajor
var baseGitMajor string

//go:linkname baseGitMinor k8s.io/component-base/version.gitMinor
var baseGitMinor string

//go:linkname baseGitTreeState k8s.io/component-base/version.gitTreeState
var baseGitTreeState string

//go:linkname baseDynamicGitVersion k8s.io/component-base/version.dynamicGitVersion
var baseDynamicGitVersion atomic.Value

//go:linkname clientGitVersion k8s.io/client-go/pkg/version.gitVersion
var clientGitVersion string

//go:linkname clientGitMajor k8s.io/client-go/pkg/version.gitMajor
var clientGitMajor string

//go:linkname clientGitMinor k8s.io/client-go/pkg/version.gitMinor
var clientGitMinor string

//go:linkname clientGitTreeState k8s.io/client-go/pkg/version.gitTreeState
var clientGitTreeState string

// KubernetesModule is the module whose version the binary reports; without it (a binary
// with only the staging modules) StagingModule's v0.MINOR.PATCH reads as v1.MINOR.PATCH,
// the release it is cut from.
const (
	KubernetesModule = "k8s.io/kubernetes"
	StagingModule    = "k8s.io/component-base"
)

func init() {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	stamp(fromBuildInfo(bi))
}

// fromBuildInfo is the Kubernetes version bi was built with ("" when it has neither module).
func fromBuildInfo(bi *debug.BuildInfo) string {
	versions := map[string]string{}
	for _, d := range bi.Deps {
		v := d.Version
		if d.Replace != nil && d.Replace.Version != "" {
			v = d.Replace.Version
		}
		versions[d.Path] = v
	}
	if v := versions[KubernetesModule]; v != "" {
		return v
	}
	if v := versions[StagingModule]; strings.HasPrefix(v, "v0.") {
		return "v1." + strings.TrimPrefix(v, "v0.")
	}
	return ""
}

// unstamped says the linker left v (a gitVersion) at its source default.
func unstamped(v string) bool { return v == "" || strings.HasPrefix(v, "v0.0.0-master") }

// stamp sets every version variable still at its default to v (e.g. v1.37.2); a version
// the linker set is kept.
func stamp(v string) {
	major, minor, ok := majorMinor(v)
	if !ok {
		return
	}
	if unstamped(baseGitVersion) {
		baseGitVersion, baseGitMajor, baseGitMinor, baseGitTreeState = v, major, minor, "clean"
		baseDynamicGitVersion.Store(v)
	}
	if unstamped(clientGitVersion) {
		clientGitVersion, clientGitMajor, clientGitMinor, clientGitTreeState = v, major, minor, "clean"
	}
}

// majorMinor splits vMAJOR.MINOR.PATCH[-pre][+build]; ok is false for anything else.
func majorMinor(v string) (major, minor string, ok bool) {
	if !strings.HasPrefix(v, "v") {
		return "", "", false
	}
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) != 3 || !digits(parts[0]) || !digits(parts[1]) || parts[2] == "" || !digits(parts[2][:1]) {
		return "", "", false
	}
	return parts[0], parts[1], true
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
