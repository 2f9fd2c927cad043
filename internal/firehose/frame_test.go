package firehose

import (
	"testing"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
)

func TestRoundTrip(t *testing.T) {
	h := "alice.test"
	b, err := Encode(TypeIdentity, &comatproto.SyncSubscribeRepos_Identity{Did: "did:plc:x", Handle: &h, Seq: 7, Time: "2026-01-01T00:00:00.000Z"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := Decode(b)
	if err != nil || ev.Seq != 7 || ev.Identity == nil || *ev.Identity.Handle != h {
		t.Fatalf("%+v %v", ev, err)
	}
	ev, err = Decode(EncodeError("ConsumerTooSlow", "slow"))
	if err != nil || ev.Error != "ConsumerTooSlow" || ev.ErrorMessage != "slow" {
		t.Fatalf("%+v %v", ev, err)
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(TypeAccount, &comatproto.SyncSubscribeRepos_Account{Did: "did:plc:x", Active: true, Seq: 1})
	f.Add(b)
	f.Add(EncodeError("FutureCursor", "x"))
	f.Add([]byte{0xa1, 0x62, 'o', 'p', 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Decode(b)
	})
}
