package crashpoint

import (
	"os"
	"os/exec"
	"testing"
)

// A binary built without the tag never exits at a point, whatever Env says; with the tag
// (go test -tags crashpoints) it exits 137 at the named point only.
func TestHit(t *testing.T) {
	if os.Getenv("CRASHPOINT_CHILD") != "" {
		for _, n := range Names {
			Hit(n)
		}
		os.Exit(0)
	}
	for _, n := range Names {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHit$")
		cmd.Env = append(os.Environ(), "CRASHPOINT_CHILD=1", Env+"="+n)
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		want := 0
		if Enabled {
			want = 137
		}
		if code != want {
			t.Fatalf("%s=%s: exit %d, want %d (crashpoints enabled: %v)", Env, n, code, want, Enabled)
		}
	}
}
