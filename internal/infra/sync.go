package infra

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
)

// Action is what one reconcile does about a deployment's record.
type Action string

const (
	// ActionNone: the object is not bound and never was; nothing to do.
	ActionNone Action = "None"
	// ActionUnbind: spec.record was removed; delete the child (forced Retain), keep the record.
	ActionUnbind Action = "Unbind"
	// ActionCreate: no record yet; write it (swap cid empty: create only if still absent).
	ActionCreate Action = "Create"
	// ActionPush: the kcp declaration changed (or, under Publish, the record differs); write it.
	ActionPush Action = "Push"
	// ActionPull: only the record changed; apply its declaration to the spec.
	ActionPull Action = "Pull"
	// ActionInSync: both sides hold the same declaration; store the hash and cid.
	ActionInSync Action = "InSync"
	// ActionConflict: both sides changed; the record wins and is pulled, and the loss is reported.
	ActionConflict Action = "Conflict"
	// ActionDelete: sync Both and the bound record is gone; delete the object (it releases its contracts).
	ActionDelete Action = "Delete"
	// ActionEnded: the record has ended; it is never written again.
	ActionEnded Action = "Ended"
	// ActionReserved: the rkey is self, the account's index; never a deployment.
	ActionReserved Action = "Reserved"
	// ActionInvalid: the record does not decode; neither pull nor overwrite it.
	ActionInvalid Action = "Invalid"
	// ActionUnavailable: the record could not be read; nothing is written, the contracts go on.
	ActionUnavailable Action = "Unavailable"
)

// WriteKind says what the controller writes to the record (through the AtprotoRecord child).
type WriteKind string

const (
	// WriteNone: leave the child as it is.
	WriteNone WriteKind = ""
	// WriteRecord: apply the child with the rendered record and SwapCID now.
	WriteRecord WriteKind = "Record"
	// WriteStatusIfDue: the declarations agree; apply the child only when StatusWriteDue says so.
	WriteStatusIfDue WriteKind = "StatusIfDue"
)

// Reasons of the Synced, SyncConflict and RecordValid conditions set by Decide.
const (
	ReasonSyncInSync          = "InSync"
	ReasonSyncWriting         = "Writing"
	ReasonSyncPulled          = "Pulled"
	ReasonSyncRecordDeleted   = "RecordDeleted"
	ReasonSyncRecordEnded     = "RecordEnded"
	ReasonSyncReserved        = "RecordKeyReserved"
	ReasonSyncInvalid         = string(v1alpha1.ReasonInvalidRecord)
	ReasonSyncUnavailable     = "RecordUnavailable"
	ReasonSyncUnbound         = "Unbound"
	ReasonConflictRecordWon   = string(v1alpha1.ReasonRecordWon)
	ReasonConflictNone        = "NoConflict"
	ReasonRecordDecoded       = "Decoded"
	ReasonRecordWrittenByKcp  = "Rendered"
	ReasonRecordInvalidPrefix = "Invalid"
)

// RecordRead is the record as the reconciler just read it with getRecord.
type RecordRead struct {
	// Found is false when getRecord answered RecordNotFound.
	Found bool
	// CID is the record's cid as read.
	CID string
	// Declaration is the decoded declaration (meaningless when Invalid is set).
	Declaration Declaration
	// Invalid is the decode error of a record that is not a declaration.
	Invalid error
	// Ended is true when the record's status phase is ended.
	Ended bool
	// ExpiresAt is an ephemeral record's deadline (status.expiresAt, else createdAt + ttlSeconds).
	ExpiresAt *time.Time
	// Status is the record's status part as written last (nil when it has none), for StatusWriteDue.
	Status *atinfra.InfraStatus
}

// ReadRecord decodes what getRecord returned (the record's JSON value and cid) for Decide and NextRkey.
func ReadRecord(kind Kind, raw []byte, cid string) RecordRead {
	r := RecordRead{Found: true, CID: cid}
	d, err := decodeRecord(kind, raw)
	if err != nil {
		r.Invalid = err
		return r
	}
	r.Declaration = d.Declaration
	r.Status = d.Status
	if d.Status != nil && deref(d.Status.Phase) == atinfra.InfraStatusPhaseEnded {
		r.Ended = true
	}
	if kind == KindEphemeralInfra {
		if d.Status != nil && d.Status.ExpiresAt != nil {
			if t, err := time.Parse(time.RFC3339Nano, *d.Status.ExpiresAt); err == nil {
				r.ExpiresAt = &t
			}
		}
		if r.ExpiresAt == nil {
			if t, err := time.Parse(time.RFC3339Nano, d.CreatedAt); err == nil {
				e := t.Add(time.Duration(d.TTLSeconds) * time.Second)
				r.ExpiresAt = &e
			}
		}
	}
	return r
}

// SyncInput is everything Decide looks at.
type SyncInput struct {
	// Bound is true while spec.record is set.
	Bound bool
	// Mode is spec.record.sync; empty is Both.
	Mode v1alpha1.RecordSyncMode
	// Following is true when spec.record.uri names the record (rather than publishing at the object's rkey).
	Following bool
	// Rkey is the record key of the bound record.
	Rkey string
	// Generation is the object's metadata.generation.
	Generation int64
	// Spec is the declaration in the object's spec.
	Spec Declaration
	// Stored is status.record as the object holds it (nil before the first sync).
	Stored *v1alpha1.InfraRecordStatus
	// Unavailable is true when getRecord failed for another reason than RecordNotFound.
	Unavailable bool
	// Record is the record as just read (meaningless when Unavailable).
	Record RecordRead
	// URI is the bound record's at-uri, stored in status.record.uri.
	URI string
	// Now is the time of the reconcile.
	Now time.Time
}

// SyncDecision is what one reconcile does about the record.
type SyncDecision struct {
	Action Action
	// Direction is the status.record.direction to report (empty: leave it).
	Direction v1alpha1.RecordSyncDirection
	// Write says whether to apply the AtprotoRecord child, and SwapCID the cid it writes against
	// (empty with Create: write only while the record is absent).
	Write   WriteKind
	SwapCID string
	// Pull is the record's declaration to apply to spec.description and spec.contracts (Pull, Conflict).
	Pull *Declaration
	// Overwrite is true under Publish when the write replaces a change made elsewhere (log infra_record_overwritten).
	Overwrite bool
	// DeleteObject is true when the object is to be deleted because its record is gone.
	DeleteObject bool
	// Record is the status.record to store. With Pull and Conflict store it only after the pull
	// was applied; nil means leave status.record unchanged.
	Record *v1alpha1.InfraRecordStatus
	// Conditions to set (with meta.SetStatusCondition); conditions not listed keep their value.
	Conditions []metav1.Condition
}

// Decide picks the one action of a reconcile of a bound object, from hs (the stored
// declaration hash), hk (the spec's) and hr (the record's):
//
//   - rkey self: Reserved. The record could not be read: Unavailable (nothing written; under
//     Publish the contracts never wait for the record).
//   - no record: Create, unless sync is Both and the record was bound before (the object had
//     seen it, or follows a uri): then Delete. Under Publish a deleted record is written again.
//   - record ended: Ended, never written again. Record does not decode: Invalid (RecordValid
//     False; neither pulled nor overwritten).
//   - hr == hk: InSync (store hr and the cid).
//   - Publish: anything else is Push, a compare-and-swap on the cid just read.
//   - Both: the record changed when its cid is not the stored one and hr != hs; the spec
//     changed when hk != hs. Only the spec changed: Push. Only the record changed: Pull. Both:
//     Conflict, the record wins (pulled) and SyncConflict True RecordWon names the losing
//     generation and the winning cid. The first sync of a publishing object whose record exists
//     is a Conflict by the same rule (hs is empty); the first sync of a following object pulls,
//     and reports a conflict only when the object already declared something else.
//
// The stored hash advances only when both sides are known to hold it: at InSync, and after a
// pull was applied. A Push or Create stores the pushed hash with the cid it swaps against and
// direction Pushed or Created, a pending push: while the record's cid stays the stored one the
// write has not landed and is retried (never pulled over); once the cid moved, a record that
// neither holds the pushed declaration nor the spec is a conflict, because the push may have
// lost the swap. That is how no edit is lost silently: every kcp edit lands or is reported.
func Decide(in SyncInput) SyncDecision {
	mode := in.Mode
	if mode == "" {
		mode = v1alpha1.RecordSyncBoth
	}
	switch {
	case !in.Bound:
		if in.Stored == nil || in.Stored.Direction == v1alpha1.RecordRetained {
			return SyncDecision{Action: ActionNone}
		}
		st := in.Stored.DeepCopy()
		st.Direction = v1alpha1.RecordRetained
		return SyncDecision{Action: ActionUnbind, Direction: v1alpha1.RecordRetained, Record: st,
			Conditions: []metav1.Condition{in.cond(v1alpha1.ConditionSynced, false, ReasonSyncUnbound, "spec.record was removed; the record stays with its last content")}}
	case in.Rkey == RkeySelf:
		return SyncDecision{Action: ActionReserved,
			Conditions: []metav1.Condition{in.cond(v1alpha1.ConditionSynced, false, ReasonSyncReserved, "the record key self holds the account's index")}}
	case in.Unavailable:
		return SyncDecision{Action: ActionUnavailable,
			Conditions: []metav1.Condition{in.cond(v1alpha1.ConditionSynced, false, ReasonSyncUnavailable, "the record could not be read")}}
	}

	// A binding that was removed (Retained) or now names another record starts over: its next
	// sync is a first sync.
	stored := in.Stored
	if stored != nil && (stored.Direction == v1alpha1.RecordRetained || (in.URI != "" && stored.URI != "" && stored.URI != in.URI)) {
		stored = nil
	}
	in.Stored = stored
	hs, storedCID := "", ""
	pending := false
	if stored != nil {
		hs, storedCID = stored.DeclarationHash, stored.CID
		pending = stored.Direction == v1alpha1.RecordPushed || stored.Direction == v1alpha1.RecordCreated
	}
	hk := Hash(in.Spec)
	rec := in.Record

	if !rec.Found {
		seen := storedCID != "" || in.Following
		if mode == v1alpha1.RecordSyncBoth && seen {
			return SyncDecision{Action: ActionDelete, DeleteObject: true,
				Conditions: []metav1.Condition{in.cond(v1alpha1.ConditionSynced, false, ReasonSyncRecordDeleted, "the bound record is gone; the object is deleted")}}
		}
		return SyncDecision{Action: ActionCreate, Direction: v1alpha1.RecordCreated, Write: WriteRecord,
			Record: in.store(hk, "", v1alpha1.RecordCreated),
			Conditions: []metav1.Condition{
				in.cond(v1alpha1.ConditionSynced, false, ReasonSyncWriting, "creating the record"),
				in.cond(v1alpha1.ConditionRecordValid, true, ReasonRecordWrittenByKcp, "the record is written from spec"),
			}}
	}
	if rec.Ended {
		return SyncDecision{Action: ActionEnded,
			Conditions: []metav1.Condition{in.cond(v1alpha1.ConditionSynced, false, ReasonSyncRecordEnded, "the record has ended and is never written again")}}
	}
	if rec.Invalid != nil {
		reason := ReasonRecordInvalidPrefix
		if ie, ok := rec.Invalid.(*InvalidRecordError); ok {
			reason = string(ie.Reason)
		}
		return SyncDecision{Action: ActionInvalid,
			Conditions: []metav1.Condition{
				in.cond(v1alpha1.ConditionRecordValid, false, reason, rec.Invalid.Error()),
				in.cond(v1alpha1.ConditionSynced, false, ReasonSyncInvalid, "the record does not decode; the contracts keep their last declaration"),
			}}
	}
	valid := in.cond(v1alpha1.ConditionRecordValid, true, ReasonRecordDecoded, "the record decodes into a declaration")
	hr := Hash(rec.Declaration)

	if hr == hk {
		st := in.store(hr, rec.CID, v1alpha1.RecordInSync)
		if in.Stored != nil && in.Stored.DeclarationHash == hr && in.Stored.CID == rec.CID &&
			in.Stored.Direction == v1alpha1.RecordInSync && in.Stored.SyncedGeneration == in.Generation && in.Stored.URI == in.URI {
			st = in.Stored.DeepCopy() // nothing moved: keep syncedAt so a second pass writes nothing
		}
		dir := v1alpha1.RecordInSync
		if in.Stored != nil && in.Stored.Direction == v1alpha1.RecordPulled && in.Stored.DeclarationHash == hr && in.Stored.URI == in.URI {
			// The pull landed and nothing was declared since: the last sync that moved the
			// declaration was a pull, and status says so. Only the cid follows the record
			// (kcp's own status writes move it); Pulled is not a pending write.
			dir = v1alpha1.RecordPulled
			st = in.Stored.DeepCopy()
			if st.CID != rec.CID || st.SyncedGeneration != in.Generation {
				st.CID, st.SyncedGeneration = rec.CID, in.Generation
				at := metav1.NewTime(in.Now)
				st.SyncedAt = &at
			}
		}
		return SyncDecision{Action: ActionInSync, Direction: dir, Write: WriteStatusIfDue, SwapCID: rec.CID,
			Record:     st,
			Conditions: []metav1.Condition{valid, in.cond(v1alpha1.ConditionSynced, true, ReasonSyncInSync, "the object and its record hold the same declaration")}}
	}

	push := func(overwrite bool) SyncDecision {
		return SyncDecision{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: rec.CID,
			Overwrite: overwrite, Record: in.store(hk, rec.CID, v1alpha1.RecordPushed),
			Conditions: []metav1.Condition{valid,
				in.cond(v1alpha1.ConditionSynced, false, ReasonSyncWriting, "writing the spec's declaration to the record"),
				in.cond(v1alpha1.ConditionSyncConflict, false, ReasonConflictNone, "no conflict since the last change")}}
	}
	recordChanged := !(storedCID != "" && rec.CID == storedCID) && hr != hs
	if mode == v1alpha1.RecordSyncPublish {
		// Anything the record holds that kcp did not last store is overwritten and logged; a
		// retry of a push whose write was lost is reported too, since the cid cannot tell.
		return push(hr != hs)
	}
	if !recordChanged {
		return push(false)
	}
	pulled := rec.Declaration
	decision := SyncDecision{Direction: v1alpha1.RecordPulled, Pull: &pulled,
		Record: in.store(hr, rec.CID, v1alpha1.RecordPulled)}
	specChanged := hk != hs
	firstFollow := in.Stored == nil && in.Following
	if (firstFollow && hk == Hash(Declaration{})) || (!firstFollow && !specChanged && !pending) {
		decision.Action = ActionPull
		decision.Conditions = []metav1.Condition{valid,
			in.cond(v1alpha1.ConditionSynced, false, ReasonSyncPulled, "applying the record's declaration to the spec"),
			in.cond(v1alpha1.ConditionSyncConflict, false, ReasonConflictNone, "no conflict since the last change")}
		return decision
	}
	decision.Action = ActionConflict
	decision.Conditions = []metav1.Condition{valid,
		in.cond(v1alpha1.ConditionSynced, false, ReasonSyncPulled, "applying the record's declaration to the spec"),
		in.cond(v1alpha1.ConditionSyncConflict, true, ReasonConflictRecordWon,
			fmt.Sprintf("both sides changed: kcp generation %d lost to record cid %s", in.Generation, rec.CID))}
	return decision
}

func (in SyncInput) store(hash, cid string, dir v1alpha1.RecordSyncDirection) *v1alpha1.InfraRecordStatus {
	at := metav1.NewTime(in.Now)
	return &v1alpha1.InfraRecordStatus{URI: in.URI, CID: cid, DeclarationHash: hash,
		SyncedGeneration: in.Generation, SyncedAt: &at, Direction: dir}
}

func (in SyncInput) cond(t v1alpha1.ConditionType, ok bool, reason, msg string) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: string(t), Status: s, Reason: reason, Message: msg,
		ObservedGeneration: in.Generation, LastTransitionTime: metav1.NewTime(in.Now)}
}
