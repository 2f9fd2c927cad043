// Command lexgen writes the Go types of lexicons/ into internal/atproto/<pkg>.
// It is run by go generate (see lexicons/lexicons.go); hack/verify-lexgen.sh
// checks that the generated files are up to date.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"socialweb.computer/internal/lexgen"
)

func main() {
	lexDir := flag.String("lexicons", "lexicons", "directory of lexicon JSON files")
	outDir := flag.String("out", "internal/atproto", "directory of the generated packages")
	flag.Parse()
	if err := run(*lexDir, *outDir); err != nil {
		fmt.Fprintln(os.Stderr, "lexgen:", err)
		os.Exit(1)
	}
}

func run(lexDir, outDir string) error {
	files, err := lexgen.ReadDir(lexDir)
	if err != nil {
		return err
	}
	out, err := lexgen.Generate(files, lexgen.Project)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(out))
	for n := range out {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(outDir, n)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, out[n]) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, out[n], 0o644); err != nil {
			return err
		}
		fmt.Println("lexgen: wrote", p)
	}
	return nil
}
