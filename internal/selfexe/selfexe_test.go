package selfexe

import (
	"os"
	"path/filepath"
	"testing"
)

// A companion is taken only when it may be trusted as root is.
func TestBeside(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string)
		want bool
	}{
		{"absent", func(*testing.T, string) {}, false},
		{"executable, owner's alone", func(t *testing.T, p string) { write(t, p, 0o755) }, true},
		{"not executable", func(t *testing.T, p string) { write(t, p, 0o644) }, false},
		{"group may write", func(t *testing.T, p string) { write(t, p, 0o775) }, false},
		{"others may write", func(t *testing.T, p string) { write(t, p, 0o757) }, false},
		{"a directory", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"a symlink to an executable", func(t *testing.T, p string) {
			write(t, p+".real", 0o755)
			if err := os.Symlink(p+".real", p); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"owned by another uid", func(t *testing.T, p string) {
			write(t, p, 0o755)
			if os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			if err := os.Chown(p, 12345, 12345); err != nil {
				t.Fatal(err)
			}
		}, os.Geteuid() != 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			self := filepath.Join(dir, "socialweb")
			write(t, self, 0o755)
			p := filepath.Join(dir, "companion")
			tc.make(t, p)
			if got := Beside(self, "companion"); (got == p) != tc.want || (got != "" && got != p) {
				t.Fatalf("Beside = %q, want taken=%v", got, tc.want)
			}
		})
	}
}

// write makes an empty file of mode, whatever the umask.
func write(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, nil, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}
