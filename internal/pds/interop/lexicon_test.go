package interop

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds/refpds"
)

// lexRow is one record write whose answer (HTTP status, error name, validationStatus) must
// be the same from our PDS and the reference.
type lexRow struct {
	name     string
	method   string // createRecord, putRecord or applyWrites
	coll     string
	rkey     string
	validate *bool
	record   map[string]any
	writes   []map[string]any // applyWrites only
}

var yes, no = true, false

const createdAt = "2026-12-03T12:00:00.000Z"

func post(extra map[string]any) map[string]any {
	m := map[string]any{"$type": "app.bsky.feed.post", "text": "hello", "createdAt": createdAt}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

func lexRows() []lexRow {
	unknown := map[string]any{"$type": "app.socialweb.unknownthing", "n": 1}
	create := func(coll string, rec map[string]any) map[string]any {
		return map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": coll, "value": rec}
	}
	return []lexRow{
		{name: "post", method: "createRecord", coll: "app.bsky.feed.post", record: post(nil)},
		{name: "post validate=true", method: "createRecord", coll: "app.bsky.feed.post", validate: &yes, record: post(nil)},
		{name: "post validate=false", method: "createRecord", coll: "app.bsky.feed.post", validate: &no, record: post(nil)},
		{name: "post without createdAt", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"createdAt": nil})},
		{name: "post without createdAt validate=false", method: "createRecord", coll: "app.bsky.feed.post", validate: &no, record: post(map[string]any{"createdAt": nil})},
		{name: "post of 301 graphemes", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"text": strings.Repeat("é", 301)})},
		{name: "post of 300 graphemes", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"text": strings.Repeat("👍🏽", 300)})},
		{name: "post with text a number", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"text": 5})},
		{name: "post with bad createdAt", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"createdAt": "yesterday"})},
		{name: "post with unknown embed type", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"embed": map[string]any{"$type": "app.socialweb.embed", "x": 1}})},
		{name: "post with bad external embed", method: "createRecord", coll: "app.bsky.feed.post", record: post(map[string]any{"embed": map[string]any{"$type": "app.bsky.embed.external", "external": map[string]any{"uri": "https://example.com"}}})},
		{name: "post at rkey self", method: "putRecord", coll: "app.bsky.feed.post", rkey: "self", record: post(nil)},
		{name: "post at rkey self validate=false", method: "putRecord", coll: "app.bsky.feed.post", rkey: "self", validate: &no, record: post(nil)},
		{name: "profile at self", method: "putRecord", coll: "app.bsky.actor.profile", rkey: "self", record: map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Alice"}},
		{name: "profile at other", method: "putRecord", coll: "app.bsky.actor.profile", rkey: "other", record: map[string]any{"$type": "app.bsky.actor.profile", "displayName": "Alice"}},
		{name: "profile with long displayName", method: "putRecord", coll: "app.bsky.actor.profile", rkey: "self", record: map[string]any{"$type": "app.bsky.actor.profile", "displayName": strings.Repeat("a", 65)}},
		{name: "chat declaration", method: "putRecord", coll: "chat.bsky.actor.declaration", rkey: "self", record: map[string]any{"$type": "chat.bsky.actor.declaration", "allowIncoming": "following"}},
		{name: "chat declaration without allowIncoming", method: "putRecord", coll: "chat.bsky.actor.declaration", rkey: "self", record: map[string]any{"$type": "chat.bsky.actor.declaration"}},
		{name: "like", method: "createRecord", coll: "app.bsky.feed.like", record: map[string]any{"$type": "app.bsky.feed.like", "createdAt": createdAt,
			"subject": map[string]any{"uri": "at://did:plc:abc/app.bsky.feed.post/3jzfcijpj2z2a", "cid": "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}}},
		{name: "unknown", method: "createRecord", coll: "app.socialweb.unknownthing", record: unknown},
		{name: "unknown validate=true", method: "createRecord", coll: "app.socialweb.unknownthing", validate: &yes, record: unknown},
		{name: "unknown validate=false", method: "createRecord", coll: "app.socialweb.unknownthing", validate: &no, record: unknown},
		{name: "non-record lexicon", method: "createRecord", coll: "com.atproto.repo.strongRef", record: map[string]any{"$type": "com.atproto.repo.strongRef", "n": 1}},
		{name: "non-record lexicon validate=true", method: "createRecord", coll: "com.atproto.repo.strongRef", validate: &yes, record: map[string]any{"$type": "com.atproto.repo.strongRef", "n": 1}},
		{name: "applyWrites post and unknown", method: "applyWrites", writes: []map[string]any{create("app.bsky.feed.post", post(nil)), create("app.socialweb.unknownthing", unknown)}},
		{name: "applyWrites post and unknown validate=true", method: "applyWrites", validate: &yes, writes: []map[string]any{create("app.bsky.feed.post", post(nil)), create("app.socialweb.unknownthing", unknown)}},
		{name: "applyWrites post and unknown validate=false", method: "applyWrites", validate: &no, writes: []map[string]any{create("app.bsky.feed.post", post(nil)), create("app.socialweb.unknownthing", unknown)}},
		{name: "applyWrites invalid post", method: "applyWrites", writes: []map[string]any{create("app.bsky.feed.post", post(map[string]any{"createdAt": nil}))}},
	}
}

// lexAnswer is what a row observed: "ok <validationStatus...>" or "<status> <error name>",
// and the error message apart (messages are worded differently and not compared).
func runLexRow(ctx context.Context, c *atclient.Client, r lexRow) (answer, message string) {
	in := map[string]any{"repo": c.DID()}
	if r.validate != nil {
		in["validate"] = *r.validate
	}
	if r.method == "applyWrites" {
		in["writes"] = r.writes
	} else {
		in["collection"], in["record"] = r.coll, r.record
		if r.rkey != "" {
			in["rkey"] = r.rkey
		}
	}
	var out struct {
		ValidationStatus *string `json:"validationStatus"`
		Results          []struct {
			ValidationStatus *string `json:"validationStatus"`
		} `json:"results"`
	}
	err := c.Call(ctx, "com.atproto.repo."+r.method, nil, in, &out, true)
	var xe *atclient.XRPCError
	if errors.As(err, &xe) {
		return fmt.Sprintf("%d %s", xe.Status, xe.Name), xe.Message
	}
	if err != nil {
		return "error", err.Error()
	}
	st := func(p *string) string {
		if p == nil {
			return "-"
		}
		return *p
	}
	if r.method == "applyWrites" {
		var sts []string
		for _, res := range out.Results {
			sts = append(sts, st(res.ValidationStatus))
		}
		return "ok " + strings.Join(sts, ","), ""
	}
	return "ok " + st(out.ValidationStatus), ""
}

// wantLex is what each row answers (ours, checked without the reference; the interop test
// checks that the reference answers the same).
var wantLex = map[string]string{
	"post":                                        "ok valid",
	"post validate=true":                          "ok valid",
	"post validate=false":                         "ok -",
	"post without createdAt":                      "400 InvalidRequest",
	"post without createdAt validate=false":       "ok -",
	"post of 301 graphemes":                       "400 InvalidRequest",
	"post of 300 graphemes":                       "ok valid",
	"post with text a number":                     "400 InvalidRequest",
	"post with bad createdAt":                     "400 InvalidRequest",
	"post with unknown embed type":                "ok valid",
	"post with bad external embed":                "400 InvalidRequest",
	"post at rkey self":                           "400 InvalidRequest",
	"post at rkey self validate=false":            "ok -",
	"profile at self":                             "ok valid",
	"profile at other":                            "400 InvalidRequest",
	"profile with long displayName":               "400 InvalidRequest",
	"chat declaration":                            "ok valid",
	"chat declaration without allowIncoming":      "400 InvalidRequest",
	"like":                                        "ok valid",
	"unknown":                                     "ok unknown",
	"unknown validate=true":                       "400 InvalidRequest",
	"unknown validate=false":                      "ok -",
	"non-record lexicon":                          "ok unknown",
	"non-record lexicon validate=true":            "400 InvalidRequest",
	"applyWrites post and unknown":                "ok valid,unknown",
	"applyWrites post and unknown validate=true":  "400 InvalidRequest",
	"applyWrites post and unknown validate=false": "ok -,-",
	"applyWrites invalid post":                    "400 InvalidRequest",
}

// TestLexiconValidationOurs runs the rows against our PDS alone (no reference needed).
func TestLexiconValidationOurs(t *testing.T) {
	ctx := context.Background()
	c := atclient.New(startOurs(t).URL())
	if _, err := c.CreateAccount(ctx, "alice.test", "alice-pw", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	for _, r := range lexRows() {
		got, msg := runLexRow(ctx, c, r)
		if want, ok := wantLex[r.name]; !ok || got != want {
			t.Errorf("%s: %s (%s), want %s", r.name, got, msg, want)
		}
	}
}

// TestInteropLexiconValidation sends the rows to the reference PDS and to ours and compares
// status, error name and validationStatus.
func TestInteropLexiconValidation(t *testing.T) {
	peer := refpds.Require(t)
	ctx := context.Background()
	ref := atclient.New(peer.PDSURL)
	if _, err := ref.CreateAccount(ctx, "alice.test", "alice-pw", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	if _, err := ref.Login(ctx, "alice.test", "alice-pw"); err != nil {
		t.Fatal(err)
	}
	ours := atclient.New(startOurs(t).URL())
	if _, err := ours.CreateAccount(ctx, "alice.test", "alice-pw", "alice@example.test"); err != nil {
		t.Fatal(err)
	}
	for _, r := range lexRows() {
		theirs, tmsg := runLexRow(ctx, ref, r)
		mine, mmsg := runLexRow(ctx, ours, r)
		if theirs != mine {
			t.Errorf("%s differs:\n reference: %s %s\n ours:      %s %s", r.name, theirs, tmsg, mine, mmsg)
		} else {
			t.Logf("%s: %s | reference: %s | ours: %s", r.name, mine, tmsg, mmsg)
		}
	}
}
