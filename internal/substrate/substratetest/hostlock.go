package substratetest

import (
	"os"
	"path/filepath"
	"testing"

	"socialweb.computer/internal/dirlock"
)

// HostExclusive holds the host-wide lock called name until the test ends. A fixture that
// puts fixed addresses or routes on the host (the internet namespace, a documentation
// address on a host link) takes it first, so that tests running in parallel, in this
// process or in another package's, never hold the same addresses at once
// (dirlock.WaitFile: a flock, per open file, gone with the process that held it).
func HostExclusive(t testing.TB, name string) {
	t.Helper()
	release, err := dirlock.WaitFile(filepath.Join(os.TempDir(), "socialweb-test-"+name+".lock"))
	if err != nil {
		t.Fatalf("host lock %s: %v", name, err)
	}
	// Registered before the fixture's own cleanups, so it runs after them: the addresses
	// are gone before the next holder adds them.
	t.Cleanup(release)
}
