package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCopyRegistryConfig(t *testing.T) {
	write := func(root, p, body string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "certs.d")
	write(src, "203.0.113.5:5000/hosts.toml", `server = "http://203.0.113.5:5000"`)
	write(src, "docker.io/hosts.toml", `[host."https://mirror.example"]`)
	write(src, "docker.io/ca.crt", "pem")
	write(src, "_default/hosts.toml", "")
	if err := copyRegistryConfig(src, dst); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"203.0.113.5:5000/hosts.toml", "docker.io/hosts.toml", "docker.io/ca.crt", "_default/hosts.toml"} {
		if _, err := os.Stat(filepath.Join(dst, p)); err != nil {
			t.Errorf("%s not copied: %v", p, err)
		}
	}
	if err := copyRegistryConfig("", filepath.Join(t.TempDir(), "empty")); err != nil {
		t.Errorf("no configuration: %v", err)
	}

	for name, bad := range map[string]func(root string){
		"a file at the top":  func(r string) { write(r, "hosts.toml", "") },
		"a nested directory": func(r string) { write(r, "docker.io/sub/hosts.toml", "") },
		"a name of no host":  func(r string) { write(r, "Bad_Host/hosts.toml", "") },
		"a link to a host file": func(r string) {
			write(r, "docker.io/hosts.toml", "")
			if err := os.Symlink("/etc/shadow", filepath.Join(r, "docker.io", "ca.crt")); err != nil {
				t.Fatal(err)
			}
		},
		"a file too large": func(r string) { write(r, "docker.io/hosts.toml", strings.Repeat("x", maxRegistryFile+1)) },
	} {
		r := t.TempDir()
		bad(r)
		if err := copyRegistryConfig(r, filepath.Join(t.TempDir(), "certs.d")); err == nil {
			t.Errorf("%s: copied", name)
		}
	}
}
