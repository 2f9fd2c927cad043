package infra

import (
	"testing"

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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseATURI(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
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
