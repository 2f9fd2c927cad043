// Package stdlex embeds the standard lexicons (app.bsky, chat.bsky, com.atproto, and the
// other record types the reference PDS knows) that the embedded PDS validates records
// against, exactly as it validates the project's own.
//
// The set is what the reference PDS validates: its record types and every lexicon their
// refs reach, no query or procedure lexicons (the PDS validates nothing else against them).
// hack/stdlex.sh regenerates lexicons/ and SOURCE from the reference PDS pinned in
// test/peers/atproto-pds and the indigo module in go.mod; SOURCE names both versions.
package stdlex

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"sort"
	"sync"

	"github.com/bluesky-social/indigo/atproto/lexicon"
)

//go:embed lexicons
var files embed.FS

// Source says where the embedded set comes from: the reference PDS version, the indigo
// version whose lexicon JSON was copied, and the record types with their key types.
//
//go:embed SOURCE
var Source string

var (
	once    sync.Once
	cat     *lexicon.BaseCatalog
	keys    map[string]string
	loadErr error
)

func load() {
	c := lexicon.NewBaseCatalog()
	k := map[string]string{}
	err := fs.WalkDir(files, "lexicons", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		var sf lexicon.SchemaFile
		if err := json.Unmarshal(b, &sf); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if err := c.AddSchemaFile(sf); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if rec, ok := sf.Defs["main"].Inner.(lexicon.SchemaRecord); ok {
			k[sf.ID] = rec.Key
		}
		return nil
	})
	if err != nil {
		loadErr = fmt.Errorf("stdlex: %w", err)
		return
	}
	cat, keys = c, k
}

// Catalog returns the catalog of the embedded lexicons, loaded once and shared (only read
// after loading). The error is non-nil only if an embedded file is broken, which the
// package tests rule out.
func Catalog() (*lexicon.BaseCatalog, error) {
	once.Do(load)
	return cat, loadErr
}

// RecordKey returns the record key type ("tid", "nsid", "any", "literal:self", ...) of a
// record type defined here, and whether it is one.
func RecordKey(collection string) (string, bool) {
	once.Do(load)
	k, ok := keys[collection]
	return k, ok
}

// Collections returns the record types defined here, sorted.
func Collections() []string {
	once.Do(load)
	out := make([]string, 0, len(keys))
	for c := range keys {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}
