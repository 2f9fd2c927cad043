package market

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAcceptedBid(t *testing.T) {
	a := Bid{URI: "at://did:plc:a/com.publicdomainrelay.temp.market.bid/1", CID: "bafya", Bidder: "did:plc:a", Cost: 5, Currency: "USD"}
	b := Bid{URI: "at://did:plc:b/com.publicdomainrelay.temp.market.bid/1", CID: "bafyb", Bidder: "did:plc:b", Free: true}
	for _, c := range []struct {
		name     string
		uri, cid string
		chosen   Bid
		bids     []Bid
		want     Bid
		wantErr  bool
	}{
		{name: "first write: the chosen bid", uri: a.URI, cid: a.CID, chosen: a, bids: []Bid{a}, want: a},
		{name: "no accept read back", chosen: a, bids: []Bid{a}, want: a},
		// A crash after the accept of a; b's cheaper bid came in before the restart.
		{name: "written before the crash, another ranks first now", uri: a.URI, cid: a.CID, chosen: b, bids: []Bid{a, b}, want: a},
		{name: "the written bid no longer in the index", uri: a.URI, cid: a.CID, chosen: b, bids: []Bid{b},
			want: Bid{URI: a.URI, CID: a.CID, Bidder: "did:plc:a"}},
		{name: "not an at-uri", uri: "https://x/y", chosen: b, bids: []Bid{b}, wantErr: true},
		{name: "authority not a DID", uri: "at://alice.test/c/1", chosen: b, bids: []Bid{b}, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := AcceptedBid(c.uri, c.cid, c.chosen, c.bids)
			if (err != nil) != c.wantErr {
				t.Fatalf("err %v, want error %v", err, c.wantErr)
			}
			if d := cmp.Diff(c.want, got); d != "" && !c.wantErr {
				t.Errorf("-want +got\n%s", d)
			}
		})
	}
}
