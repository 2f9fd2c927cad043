package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A socket under a directory deeper than a socket address holds is bound and dialled through
// its short name, and exists at its long path.
func TestShort(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	long := filepath.Join(dir, "etcd.sock")
	if _, err := net.Listen("unix", long); err == nil {
		t.Fatalf("a %d-byte socket path was bound as it is: the test cannot tell", len(long))
	}
	short, release, err := Short(long)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if len(short) > MaxPath {
		t.Fatalf("short name %q", short)
	}
	ln, err := net.Listen("unix", short)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if fi, err := os.Stat(long); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no socket at the long path: %v", err)
	}
	c, err := net.Dial("unix", short)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if p, _, _ := Short("/run/a.sock"); p != "/run/a.sock" {
		t.Fatalf("a short path changed: %q", p)
	}
}
