package jail

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
)

// libDirs are where the dynamic loader looks for a library without an ld.so.cache (the jail
// has none), in its order, for the architectures Deno ships for.
var libDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// Libraries lists the files a dynamically linked binary needs to start: its ELF interpreter
// and every DT_NEEDED library, recursively, each at the path the loader will open it by.
// A static binary needs none.
func Libraries(binary string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	var walk func(path string) error
	walk = func(path string) error {
		f, err := elf.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err != nil {
					return err
				}
				interp := string(b[:len(b)-1]) // NUL-terminated
				if !seen[interp] {
					seen[interp] = true
					out = append(out, interp)
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return err
		}
		for _, name := range needed {
			if seen[name] {
				continue
			}
			seen[name] = true
			found := ""
			for _, d := range libDirs {
				if _, err := os.Stat(filepath.Join(d, name)); err == nil {
					found = filepath.Join(d, name)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, not found in %v", path, name, libDirs)
			}
			out = append(out, found)
			if err := walk(found); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(binary); err != nil {
		return nil, err
	}
	return out, nil
}
