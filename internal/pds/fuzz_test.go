package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// FuzzXRPCInput feeds arbitrary bodies through the putRecord/applyWrites input decoding and
// record preparation: every input is either refused with an XRPCError or accepted, never a panic.
func FuzzXRPCInput(f *testing.F) {
	f.Add([]byte(`{"repo":"did:plc:x","collection":"app.x.y","rkey":"a","record":{"n":1},"swapRecord":null}`))
	f.Add([]byte(`{"repo":"did:plc:x","collection":"app.x.y","rkey":"..","record":{"$type":"app.x.z"},"swapRecord":"bafy"}`))
	f.Add([]byte(`{"writes":[{"$type":"com.atproto.repo.applyWrites#create","collection":"a.b.c","value":{"x":[1,{"$link":"bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"}]}}]}`))
	f.Add([]byte(`{"record":{"b":{"$bytes":"aGVsbG8"},"f":1.5}}`))
	f.Add([]byte(`{"record":{"i":{"$type":"blob","ref":{"$link":"bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"},"mimeType":"text/plain","size":5},"l":{"cid":"bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq","mimeType":"a/b"}}}`))
	f.Add([]byte(`{"collection":"app.bsky.feed.post","rkey":"3jzfcijpj2z2a","record":{"text":"hi","createdAt":"2026-12-03T12:00:00Z","embed":{"$type":"app.bsky.embed.images","images":[]}}}`))
	f.Add([]byte(`not json`))
	lex, err := catalogFor(nil)
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{tidClock: syntax.NewTIDClock(0), lex: lex}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in struct {
			Collection string          `json:"collection"`
			RKey       string          `json:"rkey"`
			Record     json.RawMessage `json:"record"`
			SwapRecord json.RawMessage `json:"swapRecord"`
			Writes     []struct {
				Collection string          `json:"collection"`
				RKey       string          `json:"rkey"`
				Value      json.RawMessage `json:"value"`
			} `json:"writes"`
		}
		if err := decodeJSONBody(body, &in); err != nil {
			if _, ok := err.(*XRPCError); !ok {
				t.Fatalf("untyped error %T", err)
			}
			return
		}
		_, _ = swapField(in.SwapRecord, true)
		_, _ = s.prepareWrite(Write{Action: ActionUpdate, Collection: in.Collection, RKey: in.RKey, Raw: in.Record})
		for _, w := range in.Writes {
			_, _ = s.prepareWrite(Write{Action: ActionCreate, Collection: w.Collection, RKey: w.RKey, Raw: w.Value})
		}
	})
}

// FuzzRecordCBOR round-trips stored record bytes: whatever decodes must render as JSON, and a
// record that encodes must decode back to the same CID.
func FuzzRecordCBOR(f *testing.F) {
	rec, _ := encodeRecordJSON("app.x.y", json.RawMessage(`{"n":1,"s":"x","l":[true,null],"m":{"b":{"$bytes":"AAE"}}}`))
	f.Add(rec.bytes)
	f.Add([]byte{0xa0})
	f.Add([]byte{0xff, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		js, err := recordJSON(b)
		if err != nil {
			return
		}
		again, err := encodeRecordJSON("app.x.y", js)
		if err != nil {
			return // e.g. a record whose $type is not app.x.y
		}
		if _, err := recordJSON(again.bytes); err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
	})
}

// FuzzCARRead feeds arbitrary bytes to the CAR and commit readers that verify what a PDS sends.
func FuzzCARRead(f *testing.F) {
	root, _ := cidBuilder.Sum([]byte{0xa0})
	carBytes, _ := writeCAR(root, nil, nil)
	f.Add(carBytes)
	f.Add([]byte{0x0a, 0xa1, 0x67, 'v', 'e', 'r', 's', 'i', 'o', 'n', 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		_, _, _ = repo.LoadRepoFromCAR(ctx, bytes.NewReader(b))
		_, _, _ = repo.LoadCommitFromCAR(ctx, bytes.NewReader(b))
	})
}

// FuzzSessionToken parses arbitrary Authorization headers as session tokens.
func FuzzSessionToken(f *testing.F) {
	s := &Server{jwtSecret: []byte("0123456789abcdef0123456789abcdef"), cfg: Config{ServiceDID: "did:web:localhost"}}
	f.Add("Bearer eyJ0eXAiOiJhdCtqd3QiLCJhbGciOiJIUzI1NiJ9.eyJzY29wZSI6ImNvbS5hdHByb3RvLmFjY2VzcyJ9.x")
	f.Add("Bearer a.b.c")
	f.Add("Basic abc")
	f.Fuzz(func(t *testing.T, authz string) {
		if _, err := s.parseToken(authz, scopeAccess); err != nil {
			if _, ok := err.(*XRPCError); !ok {
				t.Fatalf("untyped error %T", err)
			}
		}
	})
}
