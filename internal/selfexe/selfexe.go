// Package selfexe finds the small companion binaries hack/build.sh puts beside socialweb
// (the deno guests' jail init, the nodes' CNI plugin): each does one thing socialweb can do
// too, but starts in a millisecond where socialweb, whose Kubernetes packages run their
// initialisers first, takes tens.
package selfexe

import (
	"os"
	"path/filepath"
	"syscall"
)

// Beside returns the binary name in self's directory when one is there to be trusted with
// root: a regular executable file, owned by root or by self's owner, that neither group nor
// others may write (as self itself must be). "" otherwise: the caller uses self instead.
func Beside(self, name string) string {
	selfInfo, err := os.Stat(self)
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), name)
	fi, err := os.Lstat(p)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 || fi.Mode()&0o022 != 0 {
		return ""
	}
	owner, selfOwner := fi.Sys().(*syscall.Stat_t).Uid, selfInfo.Sys().(*syscall.Stat_t).Uid
	if owner != 0 && owner != selfOwner {
		return ""
	}
	return p
}
