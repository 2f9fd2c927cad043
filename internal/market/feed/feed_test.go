package feed

import (
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
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

func TestParseURI(t *testing.T) {
	did, c, k, err := ParseURI("at://did:plc:x/com.example.a/3k")
	if err != nil || did != "did:plc:x" || c != "com.example.a" || k != "3k" {
		t.Fatal(did, c, k, err)
	}
	for _, bad := range []string{"", "at://did:plc:x", "https://x/y/z", "at://did/c/k/extra"} {
		if _, _, _, err := ParseURI(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if URI("d", "c", "k") != "at://d/c/k" {
		t.Fatal("URI")
	}
}
