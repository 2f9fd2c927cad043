package computecontract

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
)

// IndexSnapshot is what a requester keeps of its Index between runs: the last seq handled
// of each source and what the index learnt up to them, taken in one piece so that a restart
// resuming after those seqs misses nothing and loses nothing.
type IndexSnapshot struct {
	// Version is snapshotVersion; a snapshot of another version is not used.
	Version int `json:"version"`
	// Cursors maps a source (feed.Source.CursorKey) to the last seq handled.
	Cursors   map[string]int64                `json:"cursors"`
	Offerings map[string]offering             `json:"offerings,omitempty"` // DID ->
	Bids      map[string][]market.Bid         `json:"bids,omitempty"`      // rfp uri ->
	Receipts  map[string][]market.ReceiptSeen `json:"receipts,omitempty"`  // accept uri ->
	Events    map[string][]seenEvent          `json:"events,omitempty"`    // receipt uri ->
}

// snapshotVersion is the IndexSnapshot format written.
const snapshotVersion = 1

// IndexStore keeps an IndexSnapshot. Load returns nil, nil when none was kept.
type IndexStore interface {
	Load(ctx context.Context) (*IndexSnapshot, error)
	Save(ctx context.Context, s *IndexSnapshot) error
}

// unownedKeep is how long an entry no contract owns is kept after it was last written: a
// contract owns its rfp, accept and receipt again at its first pass after a restart, and a
// bid on another requester's rfp (every bid crosses a relay) is never owned.
const unownedKeep = 10 * time.Minute

// keepEntry is whether the index keeps the entry of a uri at now: while a contract owns it,
// else until unownedKeep after it was last written.
func keepEntry(owned bool, touched, now time.Time) bool {
	return owned || now.Sub(touched) < unownedKeep
}

// wrote marks the entry of uri written (x.mu held).
func (x *Index) wrote(uri string) {
	x.touched[uri] = time.Now()
	x.dirty = true
}

// Forget says that key is gone: the entries it owned are no longer kept for it.
func (x *Index) Forget(key types.NamespacedName) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	for uri, k := range x.owners {
		if k == key {
			delete(x.owners, uri)
			x.dirty = true
		}
	}
}

// Restore starts the index from s (nil: from nothing) and lets followers start. The
// entries of s count as written at now, so each gets unownedKeep for its contract to own
// it again.
func (x *Index) Restore(s *IndexSnapshot, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	x.restoring = false
	if s == nil {
		return
	}
	maps.Copy(x.cursors, s.Cursors)
	maps.Copy(x.offers, s.Offerings)
	for rfp, bids := range s.Bids {
		m := map[string]market.Bid{}
		for _, b := range bids {
			m[b.URI] = b
		}
		x.bids[rfp] = m
		x.touched[rfp] = now
	}
	for accept, rs := range s.Receipts {
		x.receipts[accept] = slices.Clone(rs)
		x.touched[accept] = now
	}
	for receipt, es := range s.Events {
		x.events[receipt] = slices.Clone(es)
		x.touched[receipt] = now
	}
}

// snapshot drops the entries keepEntry lets go and returns a copy of the rest with the
// cursors, and whether anything changed since the last one.
func (x *Index) snapshot(now time.Time) (*IndexSnapshot, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	keep := func(uri string) bool {
		_, owned := x.owners[uri]
		if keepEntry(owned, x.touched[uri], now) {
			return true
		}
		delete(x.touched, uri)
		x.dirty = true
		return false
	}
	s := &IndexSnapshot{Version: snapshotVersion, Cursors: maps.Clone(x.cursors), Offerings: map[string]offering{},
		Bids: map[string][]market.Bid{}, Receipts: map[string][]market.ReceiptSeen{}, Events: map[string][]seenEvent{}}
	for did, o := range x.offers {
		s.Offerings[did] = o
	}
	for rfp, bids := range x.bids {
		if !keep(rfp) {
			delete(x.bids, rfp)
			continue
		}
		list := slices.Collect(maps.Values(bids))
		slices.SortFunc(list, func(a, b market.Bid) int { return strings.Compare(a.URI, b.URI) })
		s.Bids[rfp] = list
	}
	for accept, rs := range x.receipts {
		if !keep(accept) {
			delete(x.receipts, accept)
			continue
		}
		s.Receipts[accept] = slices.Clone(rs)
	}
	for receipt, es := range x.events {
		if !keep(receipt) {
			delete(x.events, receipt)
			continue
		}
		s.Events[receipt] = slices.Clone(es)
	}
	changed := x.dirty
	x.dirty = false
	return s, changed
}

// Keep saves the index to store every feed.FlushEvery while it changes, and once more when
// ctx ends. A save that fails is logged and tried again at the next tick: the snapshot kept
// is then an older one, consistent in itself, and a restart replays from its cursors.
func (x *Index) Keep(ctx context.Context, store IndexStore) {
	t := time.NewTicker(feed.FlushEvery)
	defer t.Stop()
	var failing string
	save := func(ctx context.Context) {
		s, changed := x.snapshot(time.Now())
		if !changed {
			return
		}
		if err := store.Save(ctx, s); err != nil {
			x.mu.Lock()
			x.dirty = true
			x.mu.Unlock()
			if err.Error() != failing { // once per cause, not once a second
				failing = err.Error()
				x.logger().Warn("could not keep the market index; a restart replays from the last one kept", "err", err)
			}
			return
		}
		if failing != "" {
			failing = ""
			x.logger().Info("the market index is kept again")
		}
	}
	for {
		select {
		case <-t.C:
			save(ctx)
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			save(final)
			cancel()
			return
		}
	}
}
