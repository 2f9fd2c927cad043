package computecontract

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/repos"
)

// A requester waits only for the bidders whose offering serves the contract's kind of guest;
// an offering that lists no substrates serves any.
func TestOfferingsByKind(t *testing.T) {
	offerings := map[string]mk.Offering{
		"did:plc:deno": {AppliesTo: []string{mk.ComputeVMNSID}, Substrates: []string{"deno"}, CreatedAt: "2026-11-30T00:00:00Z", EndpointURL: "http://127.0.0.1:1"},
		"did:plc:node": {AppliesTo: []string{mk.ComputeVMNSID}, Substrates: []string{"node"}, CreatedAt: "2026-11-30T00:00:00Z", EndpointURL: "http://127.0.0.1:2"},
		"did:plc:any":  {AppliesTo: []string{mk.ComputeVMNSID}, CreatedAt: "2026-11-30T00:00:00Z", EndpointURL: "http://127.0.0.1:3"},
		"did:plc:else": {AppliesTo: []string{"com.example.other"}, Substrates: []string{"node"}, CreatedAt: "2026-11-30T00:00:00Z", EndpointURL: "http://127.0.0.1:4"},
	}
	fetch := func(_ context.Context, did, collection, rkey string) (*repos.Record, error) {
		b, err := json.Marshal(offerings[did])
		return &repos.Record{URI: "at://" + did + "/" + collection + "/" + rkey, CID: "c", Value: b}, err
	}
	x := &Index{}
	x.init()
	for did := range offerings {
		x.onOffering(context.Background(), fetch, did, "at://"+did+"/"+mk.OfferingNSID+"/self", "create")
	}
	for _, row := range []struct {
		kind string
		want []string
	}{
		{"node", []string{"did:plc:any", "did:plc:node"}},
		{"deno", []string{"did:plc:any", "did:plc:deno"}},
		{"vm", []string{"did:plc:any"}},
	} {
		got := x.Offerings(row.kind)
		slices.Sort(got)
		if !slices.Equal(got, row.want) {
			t.Errorf("Offerings(%s) = %v, want %v", row.kind, got, row.want)
		}
	}
	x.onOffering(context.Background(), fetch, "did:plc:node", "at://did:plc:node/"+mk.OfferingNSID+"/self", "delete")
	if got := x.Offerings("node"); !slices.Equal(got, []string{"did:plc:any"}) {
		t.Errorf("after the node bidder's offering was deleted: %v", got)
	}
}
