package atprotorecordwatch

import (
	"fmt"
	"sort"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// maxDeleted bounds status.deleted to the most recent deletions.
const maxDeleted = 100

// state is a follower's view of its collection: the checkpoint it writes to status.
type state struct {
	cursor  int64
	records map[string]string // uri -> cid
	deleted []v1alpha1.WatchedRecord
}

func stateFromStatus(st v1alpha1.AtprotoRecordWatchStatus) *state {
	s := &state{cursor: st.Cursor, records: map[string]string{}}
	for _, r := range st.Records {
		s.records[r.URI] = r.CID
	}
	s.deleted = append(s.deleted, st.Deleted...)
	return s
}

// apply folds one event into the state and returns the changes it made to the collection
// of did. An event at or before the cursor changes nothing (it was applied already).
func (s *state) apply(ev repos.Event, did, collection string) []watch.Change {
	if ev.Seq <= s.cursor {
		return nil
	}
	s.cursor = ev.Seq
	if ev.DID != did {
		return nil
	}
	var out []watch.Change
	for _, op := range ev.Ops {
		if op.Collection != collection {
			continue
		}
		uri := fmt.Sprintf("at://%s/%s/%s", did, op.Collection, op.RKey)
		c := watch.Change{Seq: ev.Seq, DID: did, Collection: op.Collection, RKey: op.RKey, URI: uri, CID: op.CID, Action: watch.Action(op.Action)}
		switch c.Action {
		case watch.Create, watch.Update:
			s.records[uri] = op.CID
			s.undelete(uri)
		case watch.Delete:
			prev := s.records[uri]
			delete(s.records, uri)
			s.undelete(uri)
			s.deleted = append(s.deleted, v1alpha1.WatchedRecord{URI: uri, CID: prev})
			if len(s.deleted) > maxDeleted {
				s.deleted = s.deleted[len(s.deleted)-maxDeleted:]
			}
		default:
			continue
		}
		out = append(out, c)
	}
	return out
}

func (s *state) undelete(uri string) {
	out := s.deleted[:0]
	for _, d := range s.deleted {
		if d.URI != uri {
			out = append(out, d)
		}
	}
	s.deleted = out
}

// toStatus writes the state into st (records sorted by URI).
func (s *state) toStatus(st *v1alpha1.AtprotoRecordWatchStatus) {
	st.Cursor = s.cursor
	st.Records = make([]v1alpha1.WatchedRecord, 0, len(s.records))
	for uri, cid := range s.records {
		st.Records = append(st.Records, v1alpha1.WatchedRecord{URI: uri, CID: cid})
	}
	sort.Slice(st.Records, func(i, j int) bool { return st.Records[i].URI < st.Records[j].URI })
	if len(st.Records) == 0 {
		st.Records = nil
	}
	st.Deleted = append([]v1alpha1.WatchedRecord(nil), s.deleted...)
	if len(st.Deleted) == 0 {
		st.Deleted = nil
	}
}
