package nodeclaim

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestWinningPrice(t *testing.T) {
	bids := []v1alpha1.ContractBid{
		{Bidder: "did:plc:cheap", Cost: "90", Currency: "USD", Refused: "requireArch arm64"},
		{Bidder: "did:plc:free", Cost: "0"},
		{Bidder: "did:plc:priced", Cost: "120", Currency: "USD"},
		{Bidder: "did:plc:garbled", Cost: "12.5", Currency: "USD"},
	}
	for _, tc := range []struct {
		name   string
		winner string
		want   *v1alpha1.NodeClaimPrice
	}{
		{"no winner yet", "", nil},
		{"priced winner", "did:plc:priced", &v1alpha1.NodeClaimPrice{Cost: 120, Currency: "USD"}},
		{"free winner", "did:plc:free", &v1alpha1.NodeClaimPrice{Cost: 0}},
		{"a refused bid is never the price", "did:plc:cheap", nil},
		{"winner's bid not seen", "did:plc:other", nil},
		{"unreadable cost", "did:plc:garbled", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := winningPrice(&v1alpha1.ComputeContractStatus{Winner: tc.winner, Bids: bids})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("winningPrice (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPriceCap(t *testing.T) {
	usd := func(c int64) *v1alpha1.NodePrice { return &v1alpha1.NodePrice{Cost: c, Currency: "USD"} }
	eur := &v1alpha1.NodePrice{Cost: 50, Currency: "EUR"}
	for _, tc := range []struct {
		name           string
		cluster, claim *v1alpha1.NodePrice
		want           *v1alpha1.NodePrice
	}{
		{"neither", nil, nil, nil},
		{"the cluster's", usd(300), nil, usd(300)},
		{"the claim's alone", nil, usd(219), usd(219)},
		{"the claim's when lower", usd(300), usd(219), usd(219)},
		{"the cluster's when lower", usd(200), usd(219), usd(200)},
		{"the claim's in another currency", eur, usd(219), usd(219)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{NodeMaxPrice: tc.cluster}}
			nc := &v1alpha1.NodeClaim{Spec: v1alpha1.NodeClaimSpec{MaxPrice: tc.claim}}
			if diff := cmp.Diff(tc.want, priceCap(cl, nc)); diff != "" {
				t.Fatalf("priceCap (-want +got):\n%s", diff)
			}
		})
	}
	if got := priceCap(nil, &v1alpha1.NodeClaim{}); got != nil {
		t.Fatalf("no cluster, no cap: got %+v", got)
	}
}
