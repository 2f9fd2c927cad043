// Package unixsock names unix sockets whose paths are longer than a socket address holds.
//
// A unix socket address holds 108 bytes on Linux, so a socket under a deep data directory
// cannot be bound or dialled by its path. The process that binds it (and, for a socket only
// it dials, the one that dials it) may name it instead through /proc/self/fd of its
// directory, held open meanwhile.
package unixsock

import (
	"fmt"
	"os"
	"path/filepath"
)

// MaxPath is the longest path used as it is: the 108 bytes of sockaddr_un less its
// terminating NUL and a margin.
const MaxPath = 100

// Short is path when it fits a socket address; otherwise the same file named through
// /proc/self/fd of its directory, which stays open until release is called. Only the
// calling process can use the short name.
func Short(path string) (short string, release func(), err error) {
	if len(path) <= MaxPath {
		return path, func() {}, nil
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return "", nil, fmt.Errorf("the directory of socket %s: %w", path, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), func() { d.Close() }, nil
}
