package infra

import (
	"strconv"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/google/go-cmp/cmp"
)

func TestParseATURI(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    ATURI
		wantErr bool
	}{
		{name: "plc", in: "at://did:plc:abc/computer.socialweb.infra/web", want: ATURI{"did:plc:abc", "computer.socialweb.infra", "web"}},
		{name: "web did", in: "at://did:web:example.com/computer.socialweb.ephemeralInfra/r:1", want: ATURI{"did:web:example.com", "computer.socialweb.ephemeralInfra", "r:1"}},
		{name: "handle authority", in: "at://alice.example.com/computer.socialweb.infra/web", wantErr: true},
		{name: "no scheme", in: "did:plc:abc/computer.socialweb.infra/web", wantErr: true},
		{name: "no rkey", in: "at://did:plc:abc/computer.socialweb.infra", wantErr: true},
		{name: "extra segment", in: "at://did:plc:abc/computer.socialweb.infra/web/x", wantErr: true},
		{name: "bad rkey", in: "at://did:plc:abc/computer.socialweb.infra/..", wantErr: true},
		{name: "bad collection", in: "at://did:plc:abc/infra/web", wantErr: true},
		{name: "percent-encoded did:web port", in: "at://did:web:localhost%3A8080/computer.socialweb.infra/web", want: ATURI{"did:web:localhost%3A8080", "computer.socialweb.infra", "web"}},
		{name: "empty", in: "", wantErr: true},
		{name: "scheme only", in: "at://", wantErr: true},
		{name: "authority only", in: "at://did:plc:abc", wantErr: true},
		{name: "trailing slash", in: "at://did:plc:abc/computer.socialweb.infra/", wantErr: true},
		{name: "empty segments", in: "at://did:plc:abc//web", wantErr: true},
		{name: "did without method", in: "at://did::abc/computer.socialweb.infra/web", wantErr: true},
		{name: "not a did", in: "at://plc:abc/computer.socialweb.infra/web", wantErr: true},
		{name: "upper-case scheme", in: "AT://did:plc:abc/computer.socialweb.infra/web", wantErr: true},
		{name: "http scheme", in: "https://did:plc:abc/computer.socialweb.infra/web", wantErr: true},
		{name: "rkey with slash-escape", in: "at://did:plc:abc/computer.socialweb.infra/a%2Fb", wantErr: true},
		{name: "rkey with space", in: "at://did:plc:abc/computer.socialweb.infra/a b", wantErr: true},
		{name: "rkey too long", in: "at://did:plc:abc/computer.socialweb.infra/" + strings.Repeat("a", 513), wantErr: true},
		{name: "unicode rkey", in: "at://did:plc:abc/computer.socialweb.infra/wéb", wantErr: true},
		{name: "unicode authority", in: "at://did:plc:ábc/computer.socialweb.infra/web", wantErr: true},
		{name: "query", in: "at://did:plc:abc/computer.socialweb.infra/web?x=1", wantErr: true},
		{name: "fragment", in: "at://did:plc:abc/computer.socialweb.infra/web#/x", wantErr: true},
		{name: "newline", in: "at://did:plc:abc/computer.socialweb.infra/web\n", wantErr: true},
		{name: "nul", in: "at://did:plc:abc/computer.socialweb.infra/web\x00", wantErr: true},
		{name: "collection with slash-escape", in: "at://did:plc:abc/computer.socialweb%2Finfra/web", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseATURI(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err != nil && !strings.Contains(err.Error(), "at-uri "+strconv.Quote(tc.in)) {
				t.Errorf("error %q does not name the input", err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if err == nil && got.String() != tc.in {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
}

func TestCheckFollow(t *testing.T) {
	tests := []struct {
		name    string
		uri     string
		kind    Kind
		wantErr bool
	}{
		{name: "ok", uri: RecordURI("did:plc:me", KindInfra, "web"), kind: KindInfra},
		{name: "ephemeral ok", uri: RecordURI("did:plc:me", KindEphemeralInfra, "job"), kind: KindEphemeralInfra},
		{name: "another account", uri: RecordURI("did:plc:other", KindInfra, "web"), kind: KindInfra, wantErr: true},
		{name: "another collection", uri: RecordURI("did:plc:me", KindEphemeralInfra, "web"), kind: KindInfra, wantErr: true},
		{name: "not a uri", uri: "web", kind: KindInfra, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := CheckFollow(tc.uri, "did:plc:me", tc.kind); (err != nil) != tc.wantErr {
				t.Errorf("err = %v; want error %v", err, tc.wantErr)
			}
		})
	}
}

// FuzzParseATURI: whatever the input, ParseATURI does not panic, and what it accepts is a
// record's uri that prints back as the input, each part valid on its own.
func FuzzParseATURI(f *testing.F) {
	for _, s := range []string{"at://did:plc:abc/computer.socialweb.infra/web", "at://alice.test/a.b.c/k", "at://did:web:h%3A1/a.b.c/k/x", "", "at://"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := ParseATURI(s)
		if err != nil {
			return
		}
		if u.String() != s {
			t.Fatalf("ParseATURI(%q).String() = %q", s, u.String())
		}
		if _, err := syntax.ParseDID(u.DID.String()); err != nil {
			t.Fatalf("ParseATURI(%q): DID %q: %v", s, u.DID, err)
		}
		if _, err := syntax.ParseNSID(u.Collection.String()); err != nil {
			t.Fatalf("ParseATURI(%q): collection %q: %v", s, u.Collection, err)
		}
		if _, err := ParseRecordKey(u.Rkey.String()); err != nil {
			t.Fatalf("ParseATURI(%q): %v", s, err)
		}
	})
}
