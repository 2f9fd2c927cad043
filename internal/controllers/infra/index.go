package infra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// indexUpdate reads the index at computer.socialweb.infra/self, applies change, and writes
// the result with a swap on the cid it read (createRecord, must-not-exist, when there is no
// index yet), retrying on a swap mismatch. Nothing but the index is written at self.
func (r *Reconciler) indexUpdate(ctx context.Context, repo repos.Repo, now time.Time, change func(*atinfra.InfraIndex) (*atinfra.InfraIndex, bool)) error {
	if repo == nil {
		return nil
	}
	for i := 0; i < indexRetries; i++ {
		idx, createdAt, swap, err := ReadIndex(ctx, repo)
		if err != nil {
			return err
		}
		next, changed := change(idx)
		if !changed {
			return nil
		}
		if createdAt == "" {
			createdAt = now.UTC().Format(time.RFC3339)
		}
		value, err := json.Marshal(atinfra.Infra{CreatedAt: createdAt, Index: next})
		if err != nil {
			return err
		}
		_, err = repo.Put(ctx, atinfra.InfraNSID, infra.RkeySelf, value, &swap)
		if errors.Is(err, repos.ErrSwapMismatch) {
			continue
		}
		return err
	}
	return fmt.Errorf("index at self: still losing the swap after %d tries", indexRetries)
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
