package feed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"socialweb.computer/internal/atomicfile"
)

// Cursors are the last seq a follower handled of each source it follows, kept in a file so
// that a restarted follower resumes where it stopped instead of replaying a relay's whole
// window (or missing what came while it was down). A seq means something only to the source
// that issued it (a relay numbers its own stream), so cursors are keyed by the source's URL.
// The file is written at most every FlushEvery while seqs move, and on Close; a crash loses
// at most that much, which the follower handles again (its handlers are idempotent).
type Cursors struct {
	path string

	mu    sync.Mutex
	seqs  map[string]int64 // what the file held, then what was Set
	used  map[string]bool  // keys Get or Set this run: only these are written back
	dirty bool
}

// FlushEvery is how often a moving cursor is written at most.
const FlushEvery = time.Second

// CursorFileError is a cursor file that exists but cannot be read as one: the follower
// does not guess where to resume. Removing the file makes it replay each source from 0.
type CursorFileError struct {
	Path string
	Err  error
}

func (e *CursorFileError) Error() string {
	return fmt.Sprintf("cursor file %s: %v (remove it to follow every source again from its start)", e.Path, e.Err)
}

func (e *CursorFileError) Unwrap() error { return e.Err }

// cursorFile is the file's content.
type cursorFile struct {
	// Cursors maps a source URL (no trailing slash) to the last seq handled.
	Cursors map[string]int64 `json:"cursors"`
}

// CursorKey is the key of the source at url: the URL without a trailing slash, so that
// http://relay.test and http://relay.test/ share one cursor.
func CursorKey(url string) string { return strings.TrimRight(url, "/") }

// OpenCursors reads the cursors at path; a missing file is no cursor at all.
func OpenCursors(path string) (*Cursors, error) {
	c := &Cursors{path: path, seqs: map[string]int64{}, used: map[string]bool{}}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, &CursorFileError{Path: path, Err: err}
	}
	seqs, err := decodeCursors(raw)
	if err != nil {
		return nil, &CursorFileError{Path: path, Err: err}
	}
	c.seqs = seqs
	return c, nil
}

func decodeCursors(raw []byte) (map[string]int64, error) {
	var f cursorFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for k, v := range f.Cursors {
		if v < 0 {
			return nil, fmt.Errorf("negative seq %d for %s", v, k)
		}
		out[CursorKey(k)] = v
	}
	return out, nil
}

// Get is the seq to follow url from: the last one handled, or 0 (replay what it keeps).
func (c *Cursors) Get(url string) int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := CursorKey(url)
	c.used[k] = true
	return c.seqs[k]
}

// Set records that url's events up to seq are handled. A lower seq than before is kept too:
// a source that lost its history (a relay started afresh) numbers from the start again.
func (c *Cursors) Set(url string, seq int64) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	k := CursorKey(url)
	c.used[k] = true
	if c.seqs[k] != seq {
		c.seqs[k] = seq
		c.dirty = true
	}
}

// Flush writes the cursors when they moved since the last write. Only sources followed in
// this run are written: one no longer followed (or an in-process PDS on another port) does
// not stay in the file for ever.
func (c *Cursors) Flush() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if !c.dirty {
		c.mu.Unlock()
		return nil
	}
	f := cursorFile{Cursors: map[string]int64{}}
	for k := range c.used {
		f.Cursors[k] = c.seqs[k]
	}
	c.dirty = false
	c.mu.Unlock()
	raw, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(c.path), 0o700); err != nil {
		return fmt.Errorf("cursor file: %w", err)
	}
	if err := atomicfile.WriteDurable(c.path, raw, 0o600); err != nil {
		c.mu.Lock()
		c.dirty = true
		c.mu.Unlock()
		return fmt.Errorf("cursor file: %w", err)
	}
	return nil
}

// Run flushes every FlushEvery until ctx ends, then once more; errors go to onErr (nil:
// dropped), the next flush trying again.
func (c *Cursors) Run(ctx context.Context, onErr func(error)) {
	if c == nil {
		return
	}
	t := time.NewTicker(FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := c.Flush(); err != nil && onErr != nil {
				onErr(err)
			}
			return
		case <-t.C:
			if err := c.Flush(); err != nil && onErr != nil {
				onErr(err)
			}
		}
	}
}
