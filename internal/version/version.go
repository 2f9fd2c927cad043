// Package version reports the build of the socialweb binary.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is set at link time with -X socialweb.computer/internal/version.Version=...;
// otherwise it is read from the module's build info.
var Version = ""

// String is one line: version, VCS revision when known, Go version and platform.
func String() string {
	v, rev := Version, ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
				if len(rev) > 12 {
					rev = rev[:12]
				}
			case "vcs.modified":
				if s.Value == "true" && rev != "" {
					rev += "-dirty"
				}
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "dev"
	}
	if rev != "" {
		v += " (" + rev + ")"
	}
	return fmt.Sprintf("socialweb %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
