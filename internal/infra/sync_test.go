package infra

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
)

var (
	dA = Declaration{Description: "agreed"}
	dK = Declaration{Description: "kcp edit"}
	dR = Declaration{Description: "record edit", Contracts: []v1alpha1.InfraContract{{Name: "extra", State: v1alpha1.ContractStaged}}}
)

const uri = "at://did:plc:owner/computer.socialweb.infra/web"

func stored(d Declaration, cid string, dir v1alpha1.RecordSyncDirection) *v1alpha1.InfraRecordStatus {
	return &v1alpha1.InfraRecordStatus{URI: uri, CID: cid, DeclarationHash: Hash(d), SyncedGeneration: 3, SyncedAt: mtime(t0), Direction: dir}
}

func found(cid string, d Declaration) RecordRead {
	return RecordRead{Found: true, CID: cid, Declaration: d}
}

// syncWant is the part of a SyncDecision a row pins down.
type syncWant struct {
	Action    Action
	Direction v1alpha1.RecordSyncDirection
	Write     WriteKind
	SwapCID   string
	Pull      *Declaration
	Overwrite bool
	Delete    bool
	// StoreHash and StoreCID are status.record's hash and cid to store ("-" when nothing is stored).
	StoreHash, StoreCID string
	// Conditions as type=status/reason.
	Conditions []string
}

func summarize(d SyncDecision) syncWant {
	w := syncWant{Action: d.Action, Direction: d.Direction, Write: d.Write, SwapCID: d.SwapCID, Pull: d.Pull,
		Overwrite: d.Overwrite, Delete: d.DeleteObject, StoreHash: "-", StoreCID: "-"}
	if d.Record != nil {
		w.StoreHash, w.StoreCID = d.Record.DeclarationHash, d.Record.CID
	}
	for _, c := range d.Conditions {
		w.Conditions = append(w.Conditions, c.Type+"="+string(c.Status)+"/"+c.Reason)
	}
	return w
}

func TestDecide(t *testing.T) {
	base := func(mut func(*SyncInput)) SyncInput {
		in := SyncInput{Bound: true, Rkey: "web", URI: uri, Generation: 7, Spec: dA, Stored: stored(dA, "c1", v1alpha1.RecordInSync), Record: found("c1", dA), Now: t0}
		if mut != nil {
			mut(&in)
		}
		return in
	}
	valid := "RecordValid=True/Decoded"
	tests := []struct {
		name string
		in   SyncInput
		want syncWant
	}{
		{name: "never bound", in: base(func(in *SyncInput) { in.Bound, in.Stored = false, nil }),
			want: syncWant{Action: ActionNone, StoreHash: "-", StoreCID: "-"}},
		{name: "unbind keeps the record", in: base(func(in *SyncInput) { in.Bound = false }),
			want: syncWant{Action: ActionUnbind, Direction: v1alpha1.RecordRetained, StoreHash: Hash(dA), StoreCID: "c1", Conditions: []string{"Synced=False/Unbound"}}},
		{name: "unbound twice is nothing", in: base(func(in *SyncInput) { in.Bound, in.Stored = false, stored(dA, "c1", v1alpha1.RecordRetained) }),
			want: syncWant{Action: ActionNone, StoreHash: "-", StoreCID: "-"}},
		{name: "rkey self", in: base(func(in *SyncInput) { in.Rkey = "self" }),
			want: syncWant{Action: ActionReserved, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordKeyReserved"}}},
		{name: "read failed", in: base(func(in *SyncInput) { in.Unavailable = true }),
			want: syncWant{Action: ActionUnavailable, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordUnavailable"}}},
		{name: "publish read failed", in: base(func(in *SyncInput) { in.Unavailable, in.Mode = true, v1alpha1.RecordSyncPublish }),
			want: syncWant{Action: ActionUnavailable, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordUnavailable"}}},
		{name: "first sync, no record: create", in: base(func(in *SyncInput) { in.Stored, in.Record = nil, RecordRead{} }),
			want: syncWant{Action: ActionCreate, Direction: v1alpha1.RecordCreated, Write: WriteRecord, StoreHash: Hash(dA), StoreCID: "",
				Conditions: []string{"Synced=False/Writing", "RecordValid=True/Rendered"}}},
		{name: "create not landed yet: create again", in: base(func(in *SyncInput) { in.Stored, in.Record = stored(dA, "", v1alpha1.RecordCreated), RecordRead{} }),
			want: syncWant{Action: ActionCreate, Direction: v1alpha1.RecordCreated, Write: WriteRecord, StoreHash: Hash(dA), StoreCID: "",
				Conditions: []string{"Synced=False/Writing", "RecordValid=True/Rendered"}}},
		{name: "both: synced record gone deletes the object", in: base(func(in *SyncInput) { in.Record = RecordRead{} }),
			want: syncWant{Action: ActionDelete, Delete: true, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordDeleted"}}},
		{name: "both: followed record absent deletes the object", in: base(func(in *SyncInput) { in.Following, in.Stored, in.Record = true, nil, RecordRead{} }),
			want: syncWant{Action: ActionDelete, Delete: true, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordDeleted"}}},
		{name: "publish: deleted record is written again", in: base(func(in *SyncInput) { in.Mode, in.Record = v1alpha1.RecordSyncPublish, RecordRead{} }),
			want: syncWant{Action: ActionCreate, Direction: v1alpha1.RecordCreated, Write: WriteRecord, StoreHash: Hash(dA), StoreCID: "",
				Conditions: []string{"Synced=False/Writing", "RecordValid=True/Rendered"}}},
		{name: "record ended", in: base(func(in *SyncInput) { in.Record.Ended = true }),
			want: syncWant{Action: ActionEnded, StoreHash: "-", StoreCID: "-", Conditions: []string{"Synced=False/RecordEnded"}}},
		{name: "record invalid", in: base(func(in *SyncInput) {
			in.Record = RecordRead{Found: true, CID: "c2", Invalid: &InvalidRecordError{Reason: InvalidDuplicateName}}
		}), want: syncWant{Action: ActionInvalid, StoreHash: "-", StoreCID: "-", Conditions: []string{"RecordValid=False/DuplicateName", "Synced=False/InvalidRecord"}}},
		{name: "publish never overwrites an invalid record", in: base(func(in *SyncInput) {
			in.Mode, in.Record = v1alpha1.RecordSyncPublish, RecordRead{Found: true, CID: "c2", Invalid: errors.New("x")}
		}), want: syncWant{Action: ActionInvalid, StoreHash: "-", StoreCID: "-", Conditions: []string{"RecordValid=False/Invalid", "Synced=False/InvalidRecord"}}},
		{name: "in sync, nothing moved: status kept", in: base(nil),
			want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordInSync, Write: WriteStatusIfDue, SwapCID: "c1", StoreHash: Hash(dA), StoreCID: "c1",
				Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "in sync after our status write moved the cid", in: base(func(in *SyncInput) { in.Record.CID = "c2" }),
			want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordInSync, Write: WriteStatusIfDue, SwapCID: "c2", StoreHash: Hash(dA), StoreCID: "c2",
				Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "in sync after both made the same edit", in: base(func(in *SyncInput) { in.Spec, in.Record = dK, found("c2", dK) }),
			want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordInSync, Write: WriteStatusIfDue, SwapCID: "c2", StoreHash: Hash(dK), StoreCID: "c2",
				Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "pull landed, our status write moved the cid: still Pulled, in sync", in: base(func(in *SyncInput) {
			in.Spec, in.Stored, in.Record = dR, stored(dR, "c2", v1alpha1.RecordPulled), found("c3", dR)
		}), want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordPulled, Write: WriteStatusIfDue, SwapCID: "c3", StoreHash: Hash(dR), StoreCID: "c3",
			Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "pulled, then kcp edited and the push landed: InSync", in: base(func(in *SyncInput) {
			in.Spec, in.Stored, in.Record = dK, stored(dK, "c2", v1alpha1.RecordPushed), found("c3", dK)
		}), want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordInSync, Write: WriteStatusIfDue, SwapCID: "c3", StoreHash: Hash(dK), StoreCID: "c3",
			Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "kcp edit: push", in: base(func(in *SyncInput) { in.Spec = dK }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c1", StoreHash: Hash(dK), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "kcp edit with the status part changed: push", in: base(func(in *SyncInput) { in.Spec, in.Record.CID = dK, "c2" }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c2", StoreHash: Hash(dK), StoreCID: "c2",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "pending push, record untouched: push again", in: base(func(in *SyncInput) { in.Spec, in.Stored = dK, stored(dK, "c1", v1alpha1.RecordPushed) }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c1", StoreHash: Hash(dK), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "pending push, second kcp edit: push the newer", in: base(func(in *SyncInput) { in.Spec, in.Stored = dR, stored(dK, "c1", v1alpha1.RecordPushed) }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c1", StoreHash: Hash(dR), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "push landed, kcp edited again: push", in: base(func(in *SyncInput) {
			in.Spec, in.Stored, in.Record = dR, stored(dK, "c1", v1alpha1.RecordPushed), found("c2", dK)
		}), want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c2", StoreHash: Hash(dR), StoreCID: "c2",
			Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "record edit: pull", in: base(func(in *SyncInput) { in.Record = found("c2", dR) }),
			want: syncWant{Action: ActionPull, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c2",
				Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=False/NoConflict"}}},
		{name: "both edited: record wins", in: base(func(in *SyncInput) { in.Spec, in.Record = dK, found("c2", dR) }),
			want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c2",
				Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "pending push lost the swap to a record edit: record wins", in: base(func(in *SyncInput) {
			in.Spec, in.Stored, in.Record = dK, stored(dK, "c1", v1alpha1.RecordPushed), found("c2", dR)
		}), want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c2",
			Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "create lost to a record written elsewhere: record wins", in: base(func(in *SyncInput) {
			in.Stored, in.Record = stored(dA, "", v1alpha1.RecordCreated), found("c9", dR)
		}), want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c9",
			Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "first sync of a publishing object whose record exists: record wins", in: base(func(in *SyncInput) { in.Stored, in.Record = nil, found("c1", dR) }),
			want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "first sync of a publishing object that agrees", in: base(func(in *SyncInput) { in.Stored = nil }),
			want: syncWant{Action: ActionInSync, Direction: v1alpha1.RecordInSync, Write: WriteStatusIfDue, SwapCID: "c1", StoreHash: Hash(dA), StoreCID: "c1",
				Conditions: []string{valid, "Synced=True/InSync"}}},
		{name: "first sync of a following object pulls", in: base(func(in *SyncInput) {
			in.Following, in.Stored, in.Spec, in.Record = true, nil, Declaration{}, found("c1", dR)
		}),
			want: syncWant{Action: ActionPull, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=False/NoConflict"}}},
		{name: "first sync of a following object that declared otherwise: record wins, reported", in: base(func(in *SyncInput) {
			in.Following, in.Stored, in.Spec, in.Record = true, nil, dK, found("c1", dR)
		}), want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c1",
			Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "rebinding after an unbind is a first sync", in: base(func(in *SyncInput) {
			in.Stored, in.Record = stored(dA, "c1", v1alpha1.RecordRetained), found("c1", dR)
		}), want: syncWant{Action: ActionConflict, Direction: v1alpha1.RecordPulled, Pull: &dR, StoreHash: Hash(dR), StoreCID: "c1",
			Conditions: []string{valid, "Synced=False/Pulled", "SyncConflict=True/RecordWon"}}},
		{name: "publish: record edit is overwritten", in: base(func(in *SyncInput) { in.Mode, in.Record = v1alpha1.RecordSyncPublish, found("c2", dR) }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c2", Overwrite: true, StoreHash: Hash(dA), StoreCID: "c2",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "publish: both edited, kcp wins", in: base(func(in *SyncInput) { in.Mode, in.Spec, in.Record = v1alpha1.RecordSyncPublish, dK, found("c2", dR) }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c2", Overwrite: true, StoreHash: Hash(dK), StoreCID: "c2",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
		{name: "publish: kcp edit is a plain push", in: base(func(in *SyncInput) { in.Mode, in.Spec = v1alpha1.RecordSyncPublish, dK }),
			want: syncWant{Action: ActionPush, Direction: v1alpha1.RecordPushed, Write: WriteRecord, SwapCID: "c1", StoreHash: Hash(dK), StoreCID: "c1",
				Conditions: []string{valid, "Synced=False/Writing", "SyncConflict=False/NoConflict"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := summarize(Decide(tc.in))
			if d := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("decision (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecideConflictMessage(t *testing.T) {
	d := Decide(SyncInput{Bound: true, Rkey: "web", Generation: 12, Spec: dK, Stored: stored(dA, "c1", v1alpha1.RecordInSync),
		Record: found("bafyrecordcid", dR), Now: t0})
	var msg string
	for _, c := range d.Conditions {
		if c.Type == string(v1alpha1.ConditionSyncConflict) {
			msg = c.Message
			if c.ObservedGeneration != 12 || !c.LastTransitionTime.Equal(mtime(t0)) {
				t.Errorf("condition %+v", c)
			}
		}
	}
	if !strings.Contains(msg, "generation 12") || !strings.Contains(msg, "bafyrecordcid") {
		t.Errorf("message %q does not name the losing generation and the winning cid", msg)
	}
}

// A second reconcile with nothing changed decides the same and stores the same status.
func TestDecideInSyncIsIdempotent(t *testing.T) {
	in := SyncInput{Bound: true, Rkey: "web", URI: uri, Generation: 4, Spec: dA, Record: found("c1", dA), Now: t0}
	first := Decide(in)
	in.Stored, in.Now = first.Record, t0.Add(time.Second)
	second := Decide(in)
	if d := cmp.Diff(first.Record, second.Record); d != "" {
		t.Errorf("second pass changed status.record:\n%s", d)
	}
}

func TestReadRecord(t *testing.T) {
	tests := []struct {
		name string
		kind Kind
		in   string
		want RecordRead
	}{
		{name: "live infra", kind: KindInfra, in: `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z","description":"x","status":{"phase":"deployed"}}`,
			want: RecordRead{Found: true, CID: "c", Declaration: Declaration{Description: "x"}, Status: &atinfra.InfraStatus{Phase: sp("deployed")}}},
		{name: "ended infra", kind: KindInfra, in: `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z","status":{"phase":"ended"}}`,
			want: RecordRead{Found: true, CID: "c", Ended: true, Status: &atinfra.InfraStatus{Phase: sp("ended")}}},
		{name: "ephemeral deadline from status", kind: KindEphemeralInfra,
			in:   `{"$type":"computer.socialweb.ephemeralInfra","createdAt":"2026-11-30T11:00:00Z","ttlSeconds":600,"status":{"expiresAt":"2026-11-30T11:30:00Z"}}`,
			want: RecordRead{Found: true, CID: "c", ExpiresAt: tp(t0.Add(30 * time.Minute)), Status: &atinfra.InfraStatus{ExpiresAt: sp("2026-11-30T11:30:00Z")}}},
		{name: "ephemeral deadline from ttl", kind: KindEphemeralInfra,
			in:   `{"$type":"computer.socialweb.ephemeralInfra","createdAt":"2026-11-30T11:00:00Z","ttlSeconds":600}`,
			want: RecordRead{Found: true, CID: "c", ExpiresAt: tp(t0.Add(10 * time.Minute))}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ReadRecord(tc.kind, []byte(tc.in), "c")
			if d := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	if r := ReadRecord(KindInfra, []byte(`{"$type":"x"}`), "c"); r.Invalid == nil || !r.Found {
		t.Errorf("invalid record read as %+v", r)
	}
}

func tp(t time.Time) *time.Time { return &t }
