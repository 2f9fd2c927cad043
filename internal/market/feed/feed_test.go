package feed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/repos"
)

func TestDerivedTID(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	a := DerivedTID("uid-1", at, 2)
	if a != DerivedTID("uid-1", at, 2) {
		t.Fatal("not stable")
	}
	if _, err := syntax.ParseTID(a); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	seen := map[string]bool{}
	for _, seed := range []string{"uid-1", "uid-2"} {
		for n := 0; n < 5; n++ {
			k := DerivedTID(seed, at, n)
			if seen[k] {
				t.Fatalf("duplicate key %s", k)
			}
			seen[k] = true
		}
	}
}

func TestURI(t *testing.T) {
	if URI("d", "c", "k") != "at://d/c/k" {
		t.Fatal("URI")
	}
}

func TestRouter(t *testing.T) {
	calls := map[string]int{}
	hosting := func(name string, dids ...string) Fetcher {
		return func(ctx context.Context, did, coll, rkey string) (*repos.Record, error) {
			calls[name]++
			for _, d := range dids {
				if d == did {
					return &repos.Record{URI: URI(did, coll, rkey), CID: name}, nil
				}
			}
			return nil, repos.ErrNotFound
		}
	}
	down := func(ctx context.Context, did, coll, rkey string) (*repos.Record, error) {
		calls["down"]++
		return nil, repos.ErrUnavailable
	}
	r := NewRouter(hosting("own", "did:a"), down, hosting("far", "did:b"))
	f := r.Fetcher()
	ctx := context.Background()
	// Not learnt: each in turn until one has it.
	if rec, err := f(ctx, "did:b", "c", "k"); err != nil || rec.CID != "far" {
		t.Fatalf("did:b: %+v %v", rec, err)
	}
	// Nowhere: the error that is not NotFound says more.
	if _, err := f(ctx, "did:z", "c", "k"); !errors.Is(err, repos.ErrUnavailable) {
		t.Fatalf("did:z: %v, want ErrUnavailable", err)
	}
	// Learnt: only its source is asked.
	r.Learn("did:b", hosting("far", "did:b"))
	before := calls["own"]
	if rec, err := f(ctx, "did:b", "c", "k"); err != nil || rec.CID != "far" || calls["own"] != before {
		t.Fatalf("learnt did:b: %+v %v (own asked %d times)", rec, err, calls["own"]-before)
	}
	if _, err := NewRouter(hosting("own")).Fetcher()(ctx, "did:a", "c", "k"); !errors.Is(err, repos.ErrNotFound) {
		t.Fatalf("none hosts it: %v, want ErrNotFound", err)
	}
}

func TestOrLearn(t *testing.T) {
	var asked []string
	serving := map[string]bool{"relay": false, "pds": true}
	fetcher := func(name string) Fetcher {
		return func(ctx context.Context, did, coll, rkey string) (*repos.Record, error) {
			asked = append(asked, name)
			if !serving[name] {
				return nil, fmt.Errorf("%w: %s serves no record", repos.ErrUnavailable, name)
			}
			return &repos.Record{CID: name}, nil
		}
	}
	f := fetcher("relay").OrLearn(fetcher("pds"))
	ctx := context.Background()
	for _, row := range []struct {
		name       string
		relay, pds bool
		want       string // CID read, or "" for an error
		wantAsked  []string
	}{
		{name: "first read asks the relay, then the PDS", pds: true, want: "pds", wantAsked: []string{"relay", "pds"}},
		{name: "then the PDS alone", pds: true, want: "pds", wantAsked: []string{"pds"}},
		{name: "the PDS down: the relay next, and the error of the PDS", wantAsked: []string{"pds", "relay"}},
		{name: "the first source serving again goes first", relay: true, want: "relay", wantAsked: []string{"pds", "relay"}},
		{name: "and stays first", relay: true, pds: true, want: "relay", wantAsked: []string{"relay"}},
	} {
		serving["relay"], serving["pds"] = row.relay, row.pds
		asked = nil
		rec, err := f(ctx, "did:a", "c", "k")
		switch {
		case row.want == "" && (err == nil || !strings.Contains(err.Error(), "pds serves")):
			t.Errorf("%s: %v %v, want the PDS's error", row.name, rec, err)
		case row.want != "" && (err != nil || rec.CID != row.want):
			t.Errorf("%s: %v %v, want %s", row.name, rec, err, row.want)
		}
		if fmt.Sprint(asked) != fmt.Sprint(row.wantAsked) {
			t.Errorf("%s: asked %v, want %v", row.name, asked, row.wantAsked)
		}
	}
}

// The PDS of this process keeps one cursor key whatever port it listens on; a remote
// source's key is its URL's.
func TestSourceCursorKey(t *testing.T) {
	a := Source{Endpoint: "http://127.0.0.1:40001", Local: true}
	b := Source{Endpoint: "http://127.0.0.1:40002/", Local: true}
	if a.CursorKey() != b.CursorKey() || a.CursorKey() != LocalCursorKey {
		t.Errorf("the local PDS's keys on two ports: %q, %q; want %q", a.CursorKey(), b.CursorKey(), LocalCursorKey)
	}
	if got := (Source{Endpoint: "https://relay.example/"}).CursorKey(); got != "https://relay.example" {
		t.Errorf("a relay's key: %q", got)
	}
}
