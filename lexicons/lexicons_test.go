package lexicons

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/lexicon"
)

// TestEveryLexiconParsesAndResolves parses each embedded file on its own,
// checks that its path is its NSID, and resolves every ref and union member
// it names in the catalog.
func TestEveryLexiconParsesAndResolves(t *testing.T) {
	cat, err := Catalog()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	err = fs.WalkDir(FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, err := FS.ReadFile(p)
		if err != nil {
			return err
		}
		var sf lexicon.SchemaFile
		if err := json.Unmarshal(b, &sf); err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		if err := sf.FinishParse(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		if err := sf.CheckSchema(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		if want := strings.ReplaceAll(sf.ID, ".", "/") + ".json"; p != want {
			t.Errorf("%s holds %s; want it at %s", p, sf.ID, want)
		}
		if got, ok := Path(sf.ID); !ok || got != p {
			t.Errorf("Path(%s) = %q, %v", sf.ID, got, ok)
		}
		var raw any
		if err := json.Unmarshal(b, &raw); err != nil {
			return err
		}
		for _, ref := range collectRefs(raw, nil) {
			full := ref
			if strings.HasPrefix(ref, "#") {
				full = sf.ID + ref
			}
			if _, err := cat.Resolve(full); err != nil {
				t.Errorf("%s: ref %s: %v", p, ref, err)
			}
		}
		for frag := range sf.Defs {
			if _, err := cat.Resolve(sf.ID + "#" + frag); err != nil {
				t.Errorf("%s#%s not in catalog: %v", sf.ID, frag, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(NSIDs()) {
		t.Errorf("%d files, %d NSIDs", n, len(NSIDs()))
	}
	// Every JSON file on disk is embedded (a new directory needs the embed line).
	onDisk := 0
	_ = filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if d.IsDir() && p == "testdata" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			onDisk++
		}
		return nil
	})
	if onDisk != n {
		t.Errorf("%d lexicon files on disk, %d embedded", onDisk, n)
	}
}

func collectRefs(v any, out []string) []string {
	switch x := v.(type) {
	case map[string]any:
		switch x["type"] {
		case "ref":
			if r, ok := x["ref"].(string); ok {
				out = append(out, r)
			}
		case "union":
			if rs, ok := x["refs"].([]any); ok {
				for _, r := range rs {
					if s, ok := r.(string); ok {
						out = append(out, s)
					}
				}
			}
		}
		for _, c := range x {
			out = collectRefs(c, out)
		}
	case []any:
		for _, c := range x {
			out = collectRefs(c, out)
		}
	}
	return out
}

func TestKnown(t *testing.T) {
	want := []string{
		"com.publicdomainrelay.temp.market.accept",
		"com.publicdomainrelay.temp.market.bid",
		"com.publicdomainrelay.temp.market.compute.vm",
		"com.publicdomainrelay.temp.market.event",
		"com.publicdomainrelay.temp.market.offering",
		"com.publicdomainrelay.temp.market.policies.onlyMe",
		"com.publicdomainrelay.temp.market.policies.open",
		"com.publicdomainrelay.temp.market.receipt",
		"com.publicdomainrelay.temp.market.rfp",
		"computer.socialweb.ephemeralInfra",
		"computer.socialweb.infra",
	}
	if got := Collections(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("Collections() = %v", got)
	}
	for _, c := range want {
		if !Known(c) {
			t.Errorf("Known(%s) = false", c)
		}
	}
	for _, c := range []string{
		"app.bsky.feed.post",
		"com.atproto.repo.strongRef",                       // an object, not a record
		"com.publicdomainrelay.temp.market.bids.free",      // an object
		"com.publicdomainrelay.temp.cluster.createCluster", // a procedure
		"",
	} {
		if Known(c) {
			t.Errorf("Known(%q) = true", c)
		}
	}
}

// fixtures reads testdata/valid: <collection>[-variant].json.
func fixtures(t *testing.T) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir("testdata/valid")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/valid", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(e.Name(), ".json")] = b
	}
	return out
}

func collectionOf(fixture string) string {
	c, _, _ := strings.Cut(fixture, "-")
	return c
}

func TestValidFixtures(t *testing.T) {
	seen := map[string]bool{}
	for name, b := range fixtures(t) {
		c := collectionOf(name)
		seen[c] = true
		if err := ValidateJSON(c, b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if err := ValidateRecord(c, m); err != nil {
			t.Errorf("%s via ValidateRecord: %v", name, err)
		}
	}
	for _, c := range Collections() {
		if !seen[c] {
			t.Errorf("no valid fixture for %s", c)
		}
	}
}

// mutate applies one change to a decoded fixture: set the value at a dotted
// path ("contracts.0.name"), or delete it when del is true.
func mutate(t *testing.T, m map[string]any, path string, val any, del bool) {
	t.Helper()
	parts := strings.Split(path, ".")
	var cur any = m
	for i, p := range parts {
		last := i == len(parts)-1
		switch c := cur.(type) {
		case map[string]any:
			if last {
				if del {
					delete(c, p)
				} else {
					c[p] = val
				}
				return
			}
			cur = c[p]
		case []any:
			idx, err := strconv.Atoi(p)
			if err != nil || idx >= len(c) {
				t.Fatalf("bad path %s at %s", path, p)
			}
			if last {
				c[idx] = val
				return
			}
			cur = c[idx]
		default:
			t.Fatalf("bad path %s at %s", path, p)
		}
	}
}

func repeat(s string, n int) string { return strings.Repeat(s, n) }

func items(n int, v any) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = v
	}
	return out
}

const (
	infraC = "computer.socialweb.infra"
	ephC   = "computer.socialweb.ephemeralInfra"
	mkt    = "com.publicdomainrelay.temp.market."
)

func TestValidationTable(t *testing.T) {
	fx := fixtures(t)
	contract := map[string]any{"name": "c", "state": "staged"}
	entry := map[string]any{"collection": infraC, "rkey": "web"}
	cases := []struct {
		name    string
		fixture string
		path    string
		val     any
		del     bool
		reason  Reason // "" means valid
		errPath string
	}{
		// computer.socialweb.infra
		{"missing $type", infraC, "$type", nil, true, BadType, "$type"},
		{"wrong $type", infraC, "$type", ephC, false, BadType, "$type"},
		{"$type not a string", infraC, "$type", 7, false, BadType, "$type"},
		{"missing createdAt", infraC, "createdAt", nil, true, MissingField, "createdAt"},
		{"missing contract name", infraC, "contracts.0.name", nil, true, MissingField, "contracts[0].name"},
		{"contract name too long", infraC, "contracts.0.name", repeat("a", 64), false, TooLong, "contracts[0].name"},
		{"description too many graphemes", infraC, "description", repeat("é", 301), false, TooLong, "description"},
		{"description too many bytes", infraC, "description", repeat("👩‍👩‍👧", 200), false, TooLong, "description"},
		{"timeout as string", infraC, "contracts.0.vmReadyTimeoutSec", "300", false, WrongType, "contracts[0].vmReadyTimeoutSec"},
		{"timeout fractional", infraC, "contracts.0.vmReadyTimeoutSec", 1.5, false, WrongType, "contracts[0].vmReadyTimeoutSec"},
		{"timeout zero", infraC, "contracts.0.vmReadyTimeoutSec", 0, false, OutOfRange, "contracts[0].vmReadyTimeoutSec"},
		{"timeout integral float ok", infraC, "contracts.0.vmReadyTimeoutSec", 300.0, false, "", ""},
		{"bidder not a did", infraC, "contracts.0.bidderDids.0", "alice", false, BadFormat, "contracts[0].bidderDids[0]"},
		{"receipt not an at-uri", infraC, "status.contracts.0.receipt", "https://example.com/r", false, BadFormat, "status.contracts[0].receipt"},
		{"createdAt not a datetime", infraC, "createdAt", "yesterday", false, BadFormat, "createdAt"},
		{"too many contracts", infraC, "contracts", items(65, contract), false, TooLong, "contracts"},
		{"requireIsolation too long", infraC, "contracts.0.requireIsolation", repeat("v", 65), false, TooLong, "contracts[0].requireIsolation"},
		{"policyArgs not an object", infraC, "contracts.0.policyArgs", "x", false, WrongType, "contracts[0].policyArgs"},
		{"state null", infraC, "contracts.0.state", nil, false, WrongType, "contracts[0].state"},
		{"contracts not an array", infraC, "contracts", map[string]any{}, false, WrongType, "contracts"},
		{"unknown state is allowed (knownValues)", infraC, "contracts.0.state", "paused", false, "", ""},
		{"unknown extra field is allowed", infraC, "futureField", "x", false, "", ""},
		{"userData too long", infraC, "contracts.0.userData", repeat("x", 65537), false, TooLong, "contracts[0].userData"},
		{"record too large", infraC, "contracts", items(64, map[string]any{"name": "c", "state": "staged", "userData": repeat("x", 40000)}), false, TooLarge, ""},
		// the index at self
		{"index rkey bad", infraC + "-index", "index.live.0.rkey", "a/b", false, BadFormat, "index.live[0].rkey"},
		{"index collection not an nsid", infraC + "-index", "index.live.0.collection", "infra", false, BadFormat, "index.live[0].collection"},
		{"index missing updatedAt", infraC + "-index", "index.updatedAt", nil, true, MissingField, "index.updatedAt"},
		{"index too many live", infraC + "-index", "index.live", items(257, entry), false, TooLong, "index.live"},
		{"index writer too long", infraC + "-index", "index.live.0.writer", repeat("w", 65), false, TooLong, "index.live[0].writer"},
		// computer.socialweb.ephemeralInfra
		{"eph wrong $type", ephC, "$type", infraC, false, BadType, "$type"},
		{"eph missing ttl", ephC, "ttlSeconds", nil, true, MissingField, "ttlSeconds"},
		{"eph ttl below 60", ephC, "ttlSeconds", 59, false, OutOfRange, "ttlSeconds"},
		{"eph ttl fractional", ephC, "ttlSeconds", 60.5, false, WrongType, "ttlSeconds"},
		{"eph contract name too long via ref", ephC, "contracts.0.name", repeat("a", 64), false, TooLong, "contracts[0].name"},
		{"eph status expiresAt bad", ephC, "status.expiresAt", "soon", false, BadFormat, "status.expiresAt"},
		// market
		{"offering url bad", mkt + "offering", "endpointUrl", "not a uri", false, BadFormat, "endpointUrl"},
		{"offering missing appliesTo", mkt + "offering", "appliesTo", nil, true, MissingField, "appliesTo"},
		{"offering appliesTo not nsid", mkt + "offering", "appliesTo.0", "vm", false, BadFormat, "appliesTo[0]"},
		{"offering wrong $type", mkt + "offering", "$type", mkt + "bid", false, BadType, "$type"},
		{"offering isolation missing boundary", mkt + "offering-isolation", "isolation.0.boundary", nil, true, MissingField, "isolation[0].boundary"},
		{"offering isolation missing substrate", mkt + "offering-isolation", "isolation.1.substrate", nil, true, MissingField, "isolation[1].substrate"},
		{"offering isolation unknown boundary is allowed (knownValues)", mkt + "offering-isolation", "isolation.0.boundary", "enclave", false, "", ""},
		{"offering isolation layer too long", mkt + "offering-isolation", "isolation.0.layers.0", repeat("l", 65), false, TooLong, "isolation[0].layers[0]"},
		{"offering isolation not an array", mkt + "offering-isolation", "isolation", map[string]any{}, false, WrongType, "isolation"},
		{"rfp payload cid bad", mkt + "rfp", "payload.cid", "nope", false, BadFormat, "payload.cid"},
		{"rfp missing policy", mkt + "rfp", "policy", nil, true, MissingField, "policy"},
		{"rfp payload a string", mkt + "rfp", "payload", "at://did:plc:x/a.b.c/1", false, WrongType, "payload"},
		{"bid payload without $type", mkt + "bid", "payload.$type", nil, true, BadType, "payload.$type"},
		{"bid priced missing cost", mkt + "bid", "payload.cost", nil, true, MissingField, "payload.cost"},
		{"bid priced negative cost", mkt + "bid", "payload.cost", -1, false, OutOfRange, "payload.cost"},
		{"bid priced currency too long", mkt + "bid", "payload.currency", repeat("U", 17), false, TooLong, "payload.currency"},
		{"bid other payload type (open union)", mkt + "bid", "payload", map[string]any{"$type": "com.example.bids.barter"}, false, "", ""},
		{"bid config not an object", mkt + "bid", "config", []any{}, false, WrongType, "config"},
		{"bid free reason too long", mkt + "bid-free", "payload.reason", repeat("r", 1025), false, TooLong, "payload.reason"},
		{"bid wrong $type", mkt + "bid", "$type", mkt + "bids.free", false, BadType, "$type"},
		{"bid size zero cpus", mkt + "bid-size", "size.cpus", 0, false, OutOfRange, "size.cpus"},
		{"bid size zero memMiB", mkt + "bid-size", "size.memMiB", 0, false, OutOfRange, "size.memMiB"},
		{"bid size missing memMiB", mkt + "bid-size", "size.memMiB", nil, true, MissingField, "size.memMiB"},
		{"bid size cpus as string", mkt + "bid-size", "size.cpus", "2", false, WrongType, "size.cpus"},
		{"bid size not an object", mkt + "bid-size", "size", 2, false, WrongType, "size"},
		{"bid without size is valid", mkt + "bid-size", "size", nil, true, "", ""},
		{"accept missing bid", mkt + "accept", "bid", nil, true, MissingField, "bid"},
		{"accept wrong $type", mkt + "accept", "$type", mkt + "receipt", false, BadType, "$type"},
		{"receipt missing cid", mkt + "receipt", "cid", nil, true, MissingField, "cid"},
		{"receipt cid bad", mkt + "receipt", "cid", "bafy", false, BadFormat, "cid"},
		{"receipt accept uri bad", mkt + "receipt", "accept.uri", "at:/x", false, BadFormat, "accept.uri"},
		{"event onNetwork missing address", mkt + "event", "payload.address", nil, true, MissingField, "payload.address"},
		{"event onNetwork address too long", mkt + "event", "payload.address", repeat("a", 2049), false, TooLong, "payload.address"},
		{"event delete reason wrong type", mkt + "event-delete", "payload.reason", 5, false, WrongType, "payload.reason"},
		{"event missing receipt", mkt + "event", "receipt", nil, true, MissingField, "receipt"},
		{"vm zero cpus", mkt + "compute.vm", "cpus", 0, false, OutOfRange, "cpus"},
		{"vm mem as string", mkt + "compute.vm", "mem", "2G", false, WrongType, "mem"},
		{"vm user_data too long", mkt + "compute.vm", "user_data", repeat("x", 65537), false, TooLong, "user_data"},
		{"vm missing cpus", mkt + "compute.vm", "cpus", nil, true, MissingField, "cpus"},
		{"onlyMe not a did", mkt + "policies.onlyMe", "requesterDid", "me", false, BadFormat, "requesterDid"},
		{"onlyMe missing did", mkt + "policies.onlyMe", "requesterDid", nil, true, MissingField, "requesterDid"},
		{"open wrong $type", mkt + "policies.open", "$type", mkt + "policies.onlyMe", false, BadType, "$type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, ok := fx[tc.fixture]
			if !ok {
				t.Fatalf("no fixture %s", tc.fixture)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			mutate(t, m, tc.path, tc.val, tc.del)
			err := ValidateRecord(collectionOf(tc.fixture), m)
			if tc.reason == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("want a *ValidationError %s, got %v", tc.reason, err)
			}
			if ve.Reason != tc.reason || ve.Path != tc.errPath {
				t.Fatalf("got %s at %q (%v); want %s at %q", ve.Reason, ve.Path, err, tc.reason, tc.errPath)
			}
			if ReasonOf(err) != tc.reason {
				t.Fatalf("ReasonOf = %s", ReasonOf(err))
			}
			msg := err.Error()
			if !strings.Contains(msg, string(tc.reason)) || !strings.Contains(msg, tc.errPath) || len(msg) > 400 {
				t.Fatalf("message not actionable or too long: %q", msg)
			}
		})
	}
}

func TestValidateEdgeCases(t *testing.T) {
	if r := ReasonOf(ValidateRecord("app.bsky.feed.post", map[string]any{"$type": "app.bsky.feed.post"})); r != UnknownCollection {
		t.Errorf("unknown collection: %s", r)
	}
	if r := ReasonOf(ValidateJSON(infraC, []byte(`{"$type":`))); r != Invalid {
		t.Errorf("broken JSON: %s", r)
	}
	if r := ReasonOf(ValidateJSON(infraC, []byte(`[1]`))); r != WrongType {
		t.Errorf("array record: %s", r)
	}
	if r := ReasonOf(ValidateJSON(infraC, []byte(`{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z"} {}`))); r != Invalid {
		t.Errorf("trailing data: %s", r)
	}
	// A record built in Go, with Go integer and slice types.
	rec := map[string]any{
		"$type":      ephC,
		"ttlSeconds": 600,
		"contracts":  []map[string]any{{"name": "a", "state": "requested", "vmReadyTimeoutSec": int64(30)}},
		"createdAt":  "2026-11-30T11:00:00Z",
	}
	if err := ValidateRecord(ephC, rec); err != nil {
		t.Errorf("Go-built record: %v", err)
	}
	// Values that do not encode as JSON are reported, not panicked on.
	if r := ReasonOf(ValidateRecord(infraC, map[string]any{"$type": infraC, "x": make(chan int)})); r != Invalid {
		t.Errorf("unencodable: %s", r)
	}
}

func FuzzValidateJSON(f *testing.F) {
	f.Add([]byte(`{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z"}`))
	f.Add([]byte(`{"$type":"com.publicdomainrelay.temp.market.bid","payload":{"$type":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range []string{infraC, ephC, mkt + "bid", mkt + "event"} {
			_ = ValidateJSON(c, b)
		}
	})
}
