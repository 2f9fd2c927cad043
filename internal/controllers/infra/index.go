package infra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
)

// indexRetries bounds the read-change-swap loop on the index at self; each lost swap means
// another writer moved the index on, so the next try starts from its version.
const indexRetries = 16

// indexDue says whether a reconcile touches the index at self: when the record is created,
// pulled or won in a conflict, and at the first sync (or a rebind) of a record already in
// sync. Other passes leave it alone, so a steady object costs no read of self.
func indexDue(action infra.Action, stored *v1alpha1.InfraRecordStatus) bool {
	switch action {
	case infra.ActionCreate, infra.ActionPull, infra.ActionConflict:
		return true
	case infra.ActionInSync:
		return stored == nil || stored.Direction == v1alpha1.RecordCreated || stored.Direction == v1alpha1.RecordRetained
	}
	return false
}

// indexEntry is the live entry of the object's record.
func (r *Reconciler) indexEntry(o *object, b *binding) atinfra.InfraIndexEntry {
	var exp *time.Time
	if o.eph != nil && o.eph.Status.ExpiresAt != nil {
		t := o.eph.Status.ExpiresAt.Time
		exp = &t
	}
	created := o.obj.GetCreationTimestamp().Time
	if b.following {
		created = time.Time{} // the record's own entry keeps its createdAt
	}
	return infra.IndexEntryFor(r.Kind, b.rkey, created, exp, Writer)
}

// indexChange is one reconcile's change to the index at self.
type indexChange func(*atinfra.InfraIndex) (*atinfra.InfraIndex, bool)

// IndexWriter coalesces the changes to the index at self of each account. A thousand
// deployments bound to one repo would otherwise each read self, change it and swap it in
// turn, every loser of a swap starting again, so that the index cost grew with the square of
// the deployments. Here the first caller for an account becomes its writer: it reads self once,
// applies every change queued so far in order, writes once with a swap on the cid it read,
// answers every caller of that batch, and goes on while more are queued. The Infra and
// EphemeralInfra reconcilers share one (both kinds are listed in the same index).
//
// The writer keeps the index it last wrote (and its cid) for the next batch instead of reading
// and decoding self again: nothing else writes at self, and if something did, the swap on the
// kept cid fails and the batch starts again from a fresh read.
type IndexWriter struct {
	mu     sync.Mutex
	queues map[string]*indexQueue // by DID
	last   map[string]*indexState // by DID: the index as last written
}

// indexState is the index at self as read or written, and its cid ("" when there is none).
type indexState struct {
	index     *atinfra.InfraIndex
	createdAt string
	cid       string
}

type indexQueue struct {
	writing bool
	waiting []*queuedChange
}

type queuedChange struct {
	change indexChange
	done   chan error // buffered: the writer never waits on a caller
}

// NewIndexWriter returns an IndexWriter with no account queued.
func NewIndexWriter() *IndexWriter {
	return &IndexWriter{queues: map[string]*indexQueue{}, last: map[string]*indexState{}}
}

// Update applies change to the index of repo's account and returns once a write that
// includes it has landed (or failed: the caller's reconcile is retried).
func (w *IndexWriter) Update(ctx context.Context, repo repos.Repo, now time.Time, change indexChange) error {
	if repo == nil {
		return nil
	}
	c := &queuedChange{change: change, done: make(chan error, 1)}
	did := repo.DID()
	w.mu.Lock()
	q := w.queues[did]
	if q == nil {
		q = &indexQueue{}
		w.queues[did] = q
	}
	q.waiting = append(q.waiting, c)
	if q.writing {
		w.mu.Unlock()
		select {
		case err := <-c.done:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	q.writing = true
	w.mu.Unlock()

	for {
		w.mu.Lock()
		batch := q.waiting
		q.waiting = nil
		if len(batch) == 0 {
			q.writing = false
			delete(w.queues, did)
			w.mu.Unlock()
			break
		}
		known := w.last[did]
		w.mu.Unlock()
		// Only this goroutine writes the account's index while q.writing holds.
		st, err := writeIndex(ctx, repo, now, batch, known)
		w.mu.Lock()
		if st != nil {
			w.last[did] = st
		} else {
			delete(w.last, did)
		}
		w.mu.Unlock()
		for _, b := range batch {
			b.done <- err
		}
	}
	return <-c.done
}

// writeIndex applies the batch's changes in order to the index at
// computer.socialweb.infra/self (known, when the caller has it, else read) and writes the
// result with a swap on that version's cid (createRecord, must-not-exist, when there is no
// index yet), retrying from a fresh read on a swap mismatch. It returns the index as it now
// stands, or nil when that is not known. Nothing but the index is written at self.
func writeIndex(ctx context.Context, repo repos.Repo, now time.Time, batch []*queuedChange, known *indexState) (*indexState, error) {
	for i := 0; i < indexRetries; i++ {
		st := known
		known = nil
		if st == nil {
			idx, createdAt, cid, err := ReadIndex(ctx, repo)
			if err != nil {
				return nil, err
			}
			st = &indexState{index: idx, createdAt: createdAt, cid: cid}
		}
		idx, changed := st.index, false
		for _, b := range batch {
			next, ch := b.change(idx)
			if ch {
				idx, changed = next, true
			}
		}
		if !changed {
			return st, nil
		}
		createdAt := st.createdAt
		if createdAt == "" {
			createdAt = now.UTC().Format(time.RFC3339)
		}
		value, err := json.Marshal(atinfra.Infra{CreatedAt: createdAt, Index: idx})
		if err != nil {
			return nil, err
		}
		swap := st.cid
		res, err := repo.Put(ctx, atinfra.InfraNSID, infra.RkeySelf, value, &swap)
		if errors.Is(err, repos.ErrSwapMismatch) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &indexState{index: idx, createdAt: createdAt, cid: res.CID}, nil
	}
	return nil, fmt.Errorf("index at self: still losing the swap after %d tries", indexRetries)
}

// indexUpdate hands change to the shared IndexWriter (a reconciler built without one, as in
// unit tests, writes alone).
func (r *Reconciler) indexUpdate(ctx context.Context, repo repos.Repo, now time.Time, change indexChange) error {
	w := r.Index
	if w == nil {
		w = NewIndexWriter()
	}
	return w.Update(ctx, repo, now, change)
}

// ReadIndex reads the account's index at computer.socialweb.infra/self: the index (nil when
// there is none), the record's createdAt and the cid to swap against ("" when absent).
func ReadIndex(ctx context.Context, repo repos.Repo) (*atinfra.InfraIndex, string, string, error) {
	rec, err := repo.Get(ctx, atinfra.InfraNSID, infra.RkeySelf)
	if errors.Is(err, repos.ErrNotFound) {
		return nil, "", "", nil
	}
	if err != nil {
		return nil, "", "", err
	}
	var v atinfra.Infra
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		// A record at self that is not an index is replaced by one (self is reserved).
		return nil, "", rec.CID, nil
	}
	return v.Index, v.CreatedAt, rec.CID, nil
}
