package atprotorecordwatch

import (
	"testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

func TestStateApply(t *testing.T) {
	const did, coll = "did:plc:me", "com.example.note"
	uri := "at://" + did + "/" + coll + "/a"
	s := stateFromStatus(v1alpha1.AtprotoRecordWatchStatus{})
	steps := []struct {
		name    string
		ev      repos.Event
		changes []watch.Action
		cursor  int64
		records map[string]string
		deleted int
	}{
		{"create", repos.Event{Seq: 1, DID: did, Ops: []repos.Op{{Action: "create", Collection: coll, RKey: "a", CID: "c1"}}}, []watch.Action{watch.Create}, 1, map[string]string{uri: "c1"}, 0},
		{"replayed event is ignored", repos.Event{Seq: 1, DID: did, Ops: []repos.Op{{Action: "create", Collection: coll, RKey: "a", CID: "c1"}}}, nil, 1, map[string]string{uri: "c1"}, 0},
		{"other repo advances the cursor only", repos.Event{Seq: 2, DID: "did:plc:other", Ops: []repos.Op{{Action: "create", Collection: coll, RKey: "a", CID: "x"}}}, nil, 2, map[string]string{uri: "c1"}, 0},
		{"other collection advances the cursor only", repos.Event{Seq: 3, DID: did, Ops: []repos.Op{{Action: "create", Collection: "com.example.other", RKey: "a", CID: "x"}}}, nil, 3, map[string]string{uri: "c1"}, 0},
		{"identity event advances the cursor", repos.Event{Seq: 4, DID: did}, nil, 4, map[string]string{uri: "c1"}, 0},
		{"update", repos.Event{Seq: 5, DID: did, Ops: []repos.Op{{Action: "update", Collection: coll, RKey: "a", CID: "c2"}}}, []watch.Action{watch.Update}, 5, map[string]string{uri: "c2"}, 0},
		{"delete", repos.Event{Seq: 6, DID: did, Ops: []repos.Op{{Action: "delete", Collection: coll, RKey: "a"}}}, []watch.Action{watch.Delete}, 6, map[string]string{}, 1},
		{"recreate leaves deleted", repos.Event{Seq: 7, DID: did, Ops: []repos.Op{{Action: "create", Collection: coll, RKey: "a", CID: "c3"}}}, []watch.Action{watch.Create}, 7, map[string]string{uri: "c3"}, 0},
	}
	for _, st := range steps {
		got := s.apply(st.ev, did, coll)
		if len(got) != len(st.changes) {
			t.Fatalf("%s: changes %+v, want %v", st.name, got, st.changes)
		}
		for i := range got {
			if got[i].Action != st.changes[i] || got[i].URI != uri || got[i].Seq != st.ev.Seq {
				t.Fatalf("%s: change %+v", st.name, got[i])
			}
		}
		if s.cursor != st.cursor || len(s.records) != len(st.records) || len(s.deleted) != st.deleted {
			t.Fatalf("%s: state cursor %d records %v deleted %v", st.name, s.cursor, s.records, s.deleted)
		}
		for k, v := range st.records {
			if s.records[k] != v {
				t.Fatalf("%s: records %v, want %v", st.name, s.records, st.records)
			}
		}
	}
	// The status round-trips the state.
	var status v1alpha1.AtprotoRecordWatchStatus
	s.toStatus(&status)
	back := stateFromStatus(status)
	if back.cursor != 7 || back.records[uri] != "c3" || len(back.deleted) != 0 {
		t.Fatalf("round trip: %+v", back)
	}
}

func TestStateDeletedIsBounded(t *testing.T) {
	const did, coll = "did:plc:me", "c.o.l"
	s := stateFromStatus(v1alpha1.AtprotoRecordWatchStatus{})
	for i := int64(1); i <= 3*maxDeleted; i++ {
		s.apply(repos.Event{Seq: i, DID: did, Ops: []repos.Op{{Action: "delete", Collection: coll, RKey: string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('0'+i/676))}}}, did, coll)
	}
	if len(s.deleted) != maxDeleted {
		t.Fatalf("deleted has %d entries, want %d", len(s.deleted), maxDeleted)
	}
}
