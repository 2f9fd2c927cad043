package deno

import (
	"os"
	"testing"

	"socialweb.computer/internal/substrate/jail"
)

// TestMain makes the test binary the guests' jail init too (Config.Init defaults to this
// process's own binary).
func TestMain(m *testing.M) {
	jail.MaybeRun()
	os.Exit(m.Run())
}
