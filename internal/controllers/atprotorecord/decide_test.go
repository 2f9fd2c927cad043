package atprotorecord

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"socialweb.computer/lexicons"
)

func TestPrepare(t *testing.T) {
	const infra = "computer.socialweb.infra"
	rows := []struct {
		name, collection, in string
		want                 lexicons.Reason // "" means valid
		wantType             bool            // $type filled in
	}{
		{"unknown collection, $type set", "com.example.note", `{"$type":"com.example.note","text":"x"}`, "", false},
		{"unknown collection, $type absent is filled in", "com.example.note", `{"text":"x"}`, "", true},
		{"unknown collection, wrong $type", "com.example.note", `{"$type":"com.example.other"}`, lexicons.BadType, false},
		{"not an object", "com.example.note", `[1,2]`, lexicons.WrongType, false},
		{"null", "com.example.note", `null`, lexicons.WrongType, false},
		{"known collection valid", infra, `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00.000Z"}`, "", false},
		{"known collection, $type filled then validated", infra, `{"createdAt":"2026-11-30T11:00:00.000Z"}`, "", true},
		{"known collection missing field", infra, `{"$type":"computer.socialweb.infra"}`, lexicons.MissingField, false},
		{"known collection wrong type", infra, `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00.000Z","description":5}`, lexicons.WrongType, false},
		{"too large", "com.example.note", `{"text":"` + strings.Repeat("x", lexicons.MaxRecordJSONBytes) + `"}`, lexicons.TooLarge, false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			out, err := prepare(row.collection, []byte(row.in))
			if row.want == "" {
				if err != nil {
					t.Fatalf("prepare: %v", err)
				}
				var m map[string]any
				_ = json.Unmarshal(out, &m)
				if m["$type"] != row.collection {
					t.Fatalf("$type %v, want %s", m["$type"], row.collection)
				}
				return
			}
			var ir *invalidRecord
			if !errors.As(err, &ir) || ir.Reason != row.want {
				t.Fatalf("prepare: %v, want reason %s", err, row.want)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	want := json.RawMessage(`{"$type":"c","n":1}`)
	str := func(s string) *string { return &s }
	rows := []struct {
		name    string
		swapCID string
		create  bool // spec.createOnly
		seen    bool // status.cid set
		cur     current
		step    step
		swap    *string
	}{
		{"absent: create, must not exist", "", false, false, current{}, stepWrite, str("")},
		{"same value: nothing", "", false, false, current{Exists: true, CID: "a", Value: json.RawMessage(`{"n":1,"$type":"c"}`)}, stepNone, nil},
		{"same value, other swapCid: nothing (the swap only gates writes)", "z", false, false, current{Exists: true, CID: "a", Value: want}, stepNone, nil},
		{"drift: rewrite over what was read", "", false, false, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepWrite, str("a")},
		{"swapCid matches: write over it", "a", false, false, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepWrite, str("a")},
		{"swapCid differs: blocked", "b", false, false, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepBlock, nil},
		{"swapCid but no record: blocked", "b", false, false, current{}, stepBlock, nil},
		{"createOnly, absent, never seen: create, must not exist", "", true, false, current{}, stepWrite, str("")},
		{"createOnly, same value: nothing", "", true, true, current{Exists: true, CID: "a", Value: want}, stepNone, nil},
		{"createOnly, another record: blocked", "", true, true, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepBlock, nil},
		{"createOnly, another record never seen: blocked", "", true, false, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepBlock, nil},
		{"createOnly, deleted after it was seen: blocked", "", true, true, current{}, stepBlock, nil},
		{"createOnly and swapCid: swapCid governs", "a", true, true, current{Exists: true, CID: "a", Value: json.RawMessage(`{"$type":"c","n":2}`)}, stepWrite, str("a")},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			d := decide(want, guard{SwapCID: row.swapCID, CreateOnly: row.create, Seen: row.seen}, row.cur)
			if d.Step != row.step {
				t.Fatalf("step %v, want %v (%+v)", d.Step, row.step, d)
			}
			if (d.Swap == nil) != (row.swap == nil) || (d.Swap != nil && *d.Swap != *row.swap) {
				t.Fatalf("swap %v, want %v", d.Swap, row.swap)
			}
			if d.Step == stepBlock && row.swapCID != "" && !strings.Contains(d.Message, row.swapCID) {
				t.Fatalf("message %q does not name the swapCid", d.Message)
			}
		})
	}
}

func TestNeverDeleted(t *testing.T) {
	for coll, want := range map[string]bool{
		"computer.socialweb.infra": true, "computer.socialweb.ephemeralInfra": true,
		"com.example.note": false, "computer.socialweb.infraX": false,
	} {
		if NeverDeleted(coll) != want {
			t.Errorf("NeverDeleted(%s) = %v", coll, !want)
		}
	}
}
