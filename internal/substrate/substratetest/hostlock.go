package substratetest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// HostExclusive holds the host-wide lock called name until the test ends. A fixture that
// puts fixed addresses or routes on the host (the internet namespace, a documentation
// address on a host link) takes it first, so that tests running in parallel, in this
// process or in another package's, never hold the same addresses at once. The lock is a
// flock on a file in the temp dir: per open file, so two tests of one process exclude each
// other too, and it goes with the process that held it.
func HostExclusive(t testing.TB, name string) {
	t.Helper()
	p := filepath.Join(os.TempDir(), "socialweb-test-"+name+".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("host lock %s: %v", name, err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		t.Fatalf("host lock %s: %v", name, err)
	}
	// Registered before the fixture's own cleanups, so it runs after them: the addresses
	// are gone before the next holder adds them.
	t.Cleanup(func() { f.Close() })
}
