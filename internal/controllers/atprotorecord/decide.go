package atprotorecord

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"socialweb.computer/lexicons"
)

// Collections whose records the finalizer never deletes: a deployment's record is its
// history and belongs to its owner, not to the object that wrote it.
var neverDeleted = map[string]bool{
	"computer.socialweb.infra":          true,
	"computer.socialweb.ephemeralInfra": true,
}

// NeverDeleted reports whether the finalizer leaves records of collection in place
// whatever the deletionPolicy.
func NeverDeleted(collection string) bool { return neverDeleted[collection] }

// invalidRecord says why a spec's record cannot be written.
type invalidRecord struct {
	Reason lexicons.Reason
	Detail string
}

func (e *invalidRecord) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Detail) }

// prepare turns spec.record into the JSON that is written: a JSON object whose $type is the
// collection (set when absent, as a PDS does), checked against the collection's lexicon
// when one is known, and no larger than a PDS accepts.
func prepare(collection string, raw []byte) (json.RawMessage, error) {
	if len(raw) > lexicons.MaxRecordJSONBytes {
		return nil, &invalidRecord{lexicons.TooLarge, fmt.Sprintf("%d bytes of JSON, at most %d", len(raw), lexicons.MaxRecordJSONBytes)}
	}
	m, err := decode(raw)
	if err != nil {
		return nil, &invalidRecord{lexicons.WrongType, "record is not a JSON object"}
	}
	switch t, ok := m["$type"]; {
	case !ok:
		m["$type"] = collection
	case t != collection:
		return nil, &invalidRecord{lexicons.BadType, fmt.Sprintf("$type is %v, the collection is %s", t, collection)}
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, &invalidRecord{lexicons.Invalid, err.Error()}
	}
	if lexicons.Known(collection) {
		if err := lexicons.ValidateJSON(collection, out); err != nil {
			return nil, &invalidRecord{lexicons.ReasonOf(err), err.Error()}
		}
	}
	return out, nil
}

func decode(raw []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("null")
	}
	return m, nil
}

// sameRecord reports whether two JSON records hold the same data.
func sameRecord(a, b []byte) bool {
	ma, err1 := decode(a)
	mb, err2 := decode(b)
	return err1 == nil && err2 == nil && reflect.DeepEqual(ma, mb)
}

// current is what the repo holds at the record's path.
type current struct {
	Exists bool
	CID    string
	Value  json.RawMessage
}

// step is what a reconcile does with the record.
type step int

const (
	stepNone  step = iota // the repo already holds the spec's record
	stepWrite             // write it, with swap
	stepBlock             // spec.swapCid forbids the write
)

// decision is the outcome of decide.
type decision struct {
	Step step
	// Swap is the condition of the write: nil never (every write is conditioned), "" for
	// must-not-exist, else the CID the repo must hold.
	Swap *string
	// Message explains a blocked write.
	Message string
}

// guard is the condition a spec puts on its writes.
type guard struct {
	// SwapCID is spec.swapCid: write only while the repo holds this CID.
	SwapCID string
	// CreateOnly is spec.createOnly: write only to create the record, and only before the
	// object has seen one at its path (Seen).
	CreateOnly bool
	// Seen says the object has seen a record at its path before (status.cid is set).
	Seen bool
}

// decide chooses what to do with the desired record given what the repo holds. Every write
// is a compare-and-swap: against spec.swapCid when set (the user's condition), else against
// what was just read (so a concurrent edit makes the write fail and the reconcile re-read
// rather than overwrite blindly).
func decide(desired json.RawMessage, g guard, cur current) decision {
	if cur.Exists && sameRecord(desired, cur.Value) {
		return decision{Step: stepNone}
	}
	if g.SwapCID != "" {
		if !cur.Exists {
			return decision{Step: stepBlock, Message: fmt.Sprintf("spec.swapCid is %s but the repo holds no record; not written", g.SwapCID)}
		}
		if cur.CID != g.SwapCID {
			return decision{Step: stepBlock, Message: fmt.Sprintf("spec.swapCid is %s but the repo holds %s; not written", g.SwapCID, cur.CID)}
		}
		s := g.SwapCID
		return decision{Step: stepWrite, Swap: &s}
	}
	if g.CreateOnly {
		switch {
		case cur.Exists:
			return decision{Step: stepBlock, Message: fmt.Sprintf("spec.createOnly is set but the repo holds %s; not written", cur.CID)}
		case g.Seen:
			return decision{Step: stepBlock, Message: "spec.createOnly is set and the record this object saw was deleted; not written again"}
		}
		s := ""
		return decision{Step: stepWrite, Swap: &s}
	}
	s := ""
	if cur.Exists {
		s = cur.CID
	}
	return decision{Step: stepWrite, Swap: &s}
}
