package e2e

import (
	"os"
	"sync"
	"testing"
)

// builtOnce is a binary a run builds the first time a row asks for it, into a temp dir of
// its own that the run removes at its end (removeBuilt).
type builtOnce struct {
	once      sync.Once
	prefix    string // of the temp dir
	path, dir string
	err       error
}

// builtBinaries are every builtOnce of the package, removed by TestMain.
var builtBinaries = []*builtOnce{&crashBin, &relayBin}

// get builds the binary once with build, which is given a new temp dir and returns the
// binary's path (in that dir, or another binary that serves), and fails t if it could not.
func (b *builtOnce) get(t *testing.T, build func(dir string) (string, error)) string {
	t.Helper()
	b.once.Do(func() {
		if b.dir, b.err = os.MkdirTemp("", b.prefix); b.err == nil {
			b.path, b.err = build(b.dir)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// removeBuilt removes the dirs of the binaries the run built.
func removeBuilt() {
	for _, b := range builtBinaries {
		if b.dir != "" {
			os.RemoveAll(b.dir)
		}
	}
}
