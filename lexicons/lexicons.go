// Package lexicons holds the atproto lexicons of socialweb.computer (laid out
// by NSID under this directory) and validates records against them.
//
// The embedded PDS calls Known and ValidateRecord to answer validationStatus
// "valid" or "unknown" and to refuse invalid records; controllers call
// ValidateJSON (or the Decode functions of the generated packages under
// internal/atproto) to report why a record is invalid.
package lexicons

//go:generate go run ../hack/lexgen -lexicons . -out ../internal/atproto

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync"

	"github.com/bluesky-social/indigo/atproto/lexicon"
)

// FS holds every lexicon JSON file, at its NSID path (com/atproto/repo/strongRef.json).
//
//go:embed com computer
var FS embed.FS

var (
	loadOnce    sync.Once
	loadedCat   *lexicon.BaseCatalog
	loadedRecs  map[string]bool
	loadedFiles map[string]string
	loadErr     error
)

func load() {
	cat := lexicon.NewBaseCatalog()
	if err := cat.LoadEmbedFS(FS); err != nil {
		loadErr = fmt.Errorf("lexicons: load catalog: %w", err)
		return
	}
	recs := map[string]bool{}
	files := map[string]string{}
	err := fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".json") {
			return err
		}
		b, err := FS.ReadFile(p)
		if err != nil {
			return err
		}
		var head struct {
			ID   string `json:"id"`
			Defs map[string]struct {
				Type string `json:"type"`
			} `json:"defs"`
		}
		if err := json.Unmarshal(b, &head); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		files[head.ID] = p
		if head.Defs["main"].Type == "record" {
			recs[head.ID] = true
		}
		return nil
	})
	if err != nil {
		loadErr = fmt.Errorf("lexicons: list: %w", err)
		return
	}
	loadedCat, loadedRecs, loadedFiles = cat, recs, files
}

// Catalog returns the catalog of every embedded lexicon. It is loaded once
// and shared; a BaseCatalog is only read after loading, so it is safe for
// concurrent use. The error is only ever non-nil if an embedded file is broken,
// which the package tests rule out.
func Catalog() (*lexicon.BaseCatalog, error) {
	loadOnce.Do(load)
	return loadedCat, loadErr
}

// Known reports whether collection is a record type defined here. The PDS
// answers validationStatus "unknown" for a collection that is not Known.
func Known(collection string) bool {
	loadOnce.Do(load)
	return loadedRecs[collection]
}

// Collections returns the NSIDs of every record type defined here, sorted.
func Collections() []string {
	loadOnce.Do(load)
	out := make([]string, 0, len(loadedRecs))
	for c := range loadedRecs {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// NSIDs returns the NSID of every lexicon file embedded here, sorted.
func NSIDs() []string {
	loadOnce.Do(load)
	out := make([]string, 0, len(loadedFiles))
	for id := range loadedFiles {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Path returns the path inside FS of the lexicon file for nsid.
func Path(nsid string) (string, bool) {
	loadOnce.Do(load)
	p, ok := loadedFiles[nsid]
	return p, ok
}
