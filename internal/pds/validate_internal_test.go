package pds

import (
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
)

func TestDecideCheck(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		name     string
		validate *bool
		known    bool
		want     recordCheck
	}{
		{"known, validate unset", nil, true, checkValidate},
		{"known, validate true", &yes, true, checkValidate},
		{"known, validate false", &no, true, checkNone},
		{"unknown, validate unset", nil, false, checkUnknown},
		{"unknown, validate true", &yes, false, checkRefuse},
		{"unknown, validate false", &no, false, checkNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideCheck(tc.validate, tc.known); got != tc.want {
				t.Fatalf("decideCheck = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestCheckRecordKey(t *testing.T) {
	for _, tc := range []struct {
		key, rkey string
		ok        bool
	}{
		{"any", "anything-at:all", true},
		{"tid", "3jzfcijpj2z2a", true},
		{"tid", "self", false},
		{"nsid", "app.bsky.feed.post", true},
		{"nsid", "3jzfcijpj2z2a", false},
		{"literal:self", "self", true},
		{"literal:self", "other", false},
		{"bogus", "x", false},
	} {
		err := checkRecordKey(tc.key, syntax.RecordKey(tc.rkey))
		if (err == nil) != tc.ok {
			t.Errorf("checkRecordKey(%q, %q) = %v, want ok %v", tc.key, tc.rkey, err, tc.ok)
		}
	}
}
