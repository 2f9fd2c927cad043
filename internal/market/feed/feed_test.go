package feed

import (
	"context"
	"errors"
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
