// Command stdlex writes the standard lexicons the embedded PDS validates records against
// into internal/pds/stdlex/lexicons: the record types the reference PDS validates (listed
// by records.mjs from its install) and every lexicon their refs reach, taken from the
// lexicon JSON of the indigo module in go.mod, or from hack/stdlex/extra for the few the
// reference ships that indigo does not yet have. Files are written compacted (descriptions
// kept) at their NSID paths. hack/stdlex.sh runs it.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	indigoDir := flag.String("indigo", "", "the indigo module directory (its lexicons/ is read)")
	indigoVersion := flag.String("indigo-version", "", "the indigo module version, recorded in SOURCE")
	records := flag.String("records", "", `file of "NSID KEY" lines: the reference's record types`)
	refVersion := flag.String("ref-version", "", "the reference PDS version, recorded in SOURCE")
	extra := flag.String("extra", "hack/stdlex/extra", "lexicon JSON files indigo lacks")
	out := flag.String("out", "internal/pds/stdlex", "the package directory to write lexicons/ and SOURCE into")
	flag.Parse()
	if err := run(*indigoDir, *indigoVersion, *records, *refVersion, *extra, *out); err != nil {
		fmt.Fprintln(os.Stderr, "stdlex:", err)
		os.Exit(1)
	}
}

type lexFile struct {
	raw  []byte
	from string
	doc  struct {
		ID   string                     `json:"id"`
		Defs map[string]json.RawMessage `json:"defs"`
	}
}

func readTree(dir, from string, into map[string]*lexFile) error {
	return filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		f := &lexFile{raw: b, from: from}
		if err := json.Unmarshal(b, &f.doc); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		into[f.doc.ID] = f // a later tree (extra) wins
		return nil
	})
}

// refsOf collects every NSID named by a "ref" or "refs" anywhere in v.
func refsOf(v any, self string, acc map[string]bool) {
	add := func(r string) {
		nsid, _, _ := strings.Cut(r, "#")
		if nsid == "" {
			nsid = self
		}
		acc[nsid] = true
	}
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			switch k {
			case "ref":
				if s, ok := e.(string); ok {
					add(s)
					continue
				}
			case "refs":
				if l, ok := e.([]any); ok {
					for _, r := range l {
						if s, ok := r.(string); ok {
							add(s)
						}
					}
					continue
				}
			}
			refsOf(e, self, acc)
		}
	case []any:
		for _, e := range x {
			refsOf(e, self, acc)
		}
	}
}

func run(indigoDir, indigoVersion, recordsFile, refVersion, extra, out string) error {
	if indigoDir == "" || recordsFile == "" {
		return fmt.Errorf("-indigo and -records are required")
	}
	all := map[string]*lexFile{}
	if err := readTree(filepath.Join(indigoDir, "lexicons"), "indigo", all); err != nil {
		return err
	}
	if err := readTree(extra, "extra", all); err != nil {
		return err
	}
	lines, err := os.ReadFile(recordsFile)
	if err != nil {
		return err
	}
	var roots []string
	for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		nsid, key, ok := strings.Cut(strings.TrimSpace(l), " ")
		if !ok {
			return fmt.Errorf("records: bad line %q", l)
		}
		f := all[nsid]
		if f == nil {
			return fmt.Errorf("record %s: no lexicon in indigo %s or %s", nsid, indigoVersion, extra)
		}
		var main struct {
			Type string `json:"type"`
			Key  string `json:"key"`
		}
		if err := json.Unmarshal(f.doc.Defs["main"], &main); err != nil || main.Type != "record" {
			return fmt.Errorf("record %s: main is not a record in %s", nsid, f.from)
		}
		if main.Key != key {
			return fmt.Errorf("record %s: key %q in %s, %q in the reference", nsid, main.Key, f.from, key)
		}
		roots = append(roots, nsid)
	}
	// The closure of refs from the record types.
	keep := map[string]bool{}
	queue := append([]string(nil), roots...)
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if keep[id] {
			continue
		}
		f := all[id]
		if f == nil {
			return fmt.Errorf("lexicon %s is referenced but not found", id)
		}
		keep[id] = true
		var v any
		if err := json.Unmarshal(f.raw, &v); err != nil {
			return err
		}
		acc := map[string]bool{}
		refsOf(v, id, acc)
		for r := range acc {
			if !keep[r] {
				queue = append(queue, r)
			}
		}
	}
	ids := make([]string, 0, len(keep))
	for id := range keep {
		ids = append(ids, id)
	}
	sort.Strings(ids)

	lexDir := filepath.Join(out, "lexicons")
	if err := os.RemoveAll(lexDir); err != nil {
		return err
	}
	fromExtra := []string{}
	for _, id := range ids {
		f := all[id]
		if f.from == "extra" {
			fromExtra = append(fromExtra, id)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, f.raw); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		buf.WriteByte('\n')
		p := filepath.Join(lexDir, filepath.FromSlash(strings.ReplaceAll(id, ".", "/"))+".json")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	var src strings.Builder
	fmt.Fprintf(&src, "reference: @atproto/pds %s (its record types, repo/prepare.js)\n", refVersion)
	fmt.Fprintf(&src, "schemas: github.com/bluesky-social/indigo %s lexicons/\n", indigoVersion)
	fmt.Fprintf(&src, "schemas from hack/stdlex/extra: %s\n", strings.Join(fromExtra, " "))
	fmt.Fprintf(&src, "records: %d, lexicon files: %d\n", len(roots), len(ids))
	for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		fmt.Fprintf(&src, "record %s\n", strings.TrimSpace(l))
	}
	return os.WriteFile(filepath.Join(out, "SOURCE"), []byte(src.String()), 0o644)
}
