package market

import (
	"encoding/json"
	"strings"
	"testing"

	"socialweb.computer/internal/atproto/atrepo"
	"socialweb.computer/internal/atproto/lextest"
	"socialweb.computer/lexicons"
)

const fixtures = "../../../lexicons/testdata/valid"

// decoders maps each record collection to its Decode function and a fresh value.
var decoders = map[string]struct {
	decode func([]byte) (any, error)
	fresh  func() any
}{
	OfferingNSID:       {func(b []byte) (any, error) { return DecodeOffering(b) }, func() any { return new(Offering) }},
	RFPNSID:            {func(b []byte) (any, error) { return DecodeRFP(b) }, func() any { return new(RFP) }},
	BidNSID:            {func(b []byte) (any, error) { return DecodeBid(b) }, func() any { return new(Bid) }},
	AcceptNSID:         {func(b []byte) (any, error) { return DecodeAccept(b) }, func() any { return new(Accept) }},
	ReceiptNSID:        {func(b []byte) (any, error) { return DecodeReceipt(b) }, func() any { return new(Receipt) }},
	EventNSID:          {func(b []byte) (any, error) { return DecodeEvent(b) }, func() any { return new(Event) }},
	ComputeVMNSID:      {func(b []byte) (any, error) { return DecodeComputeVM(b) }, func() any { return new(ComputeVM) }},
	PoliciesOnlyMeNSID: {func(b []byte) (any, error) { return DecodePoliciesOnlyMe(b) }, func() any { return new(PoliciesOnlyMe) }},
	PoliciesOpenNSID:   {func(b []byte) (any, error) { return DecodePoliciesOpen(b) }, func() any { return new(PoliciesOpen) }},
}

func TestRoundTrip(t *testing.T) {
	seen := map[string]bool{}
	for name, b := range lextest.Fixtures(t, fixtures, "com.publicdomainrelay.temp.market.") {
		c := lextest.Collection(name)
		d, ok := decoders[c]
		if !ok {
			t.Fatalf("no decoder for %s", c)
		}
		seen[c] = true
		t.Run(name, func(t *testing.T) {
			if _, err := d.decode(b); err != nil {
				t.Fatal(err)
			}
			lextest.RoundTrip(t, b, d.fresh())
		})
	}
	for c := range decoders {
		if !seen[c] {
			t.Errorf("no fixture for %s", c)
		}
	}
	for _, c := range lexicons.Collections() {
		if _, ok := decoders[c]; !ok && strings.HasPrefix(c, "com.publicdomainrelay.temp.market.") {
			t.Errorf("record %s has no round-trip test", c)
		}
	}
}

func TestUnions(t *testing.T) {
	fx := lextest.Fixtures(t, fixtures, BidNSID)
	bid, err := DecodeBid(fx[BidNSID])
	if err != nil {
		t.Fatal(err)
	}
	if bid.Payload.BidsPriced == nil || bid.Payload.BidsPriced.Cost != 12 || bid.Payload.Type() != BidsPricedNSID {
		t.Fatalf("priced payload: %+v", bid.Payload)
	}
	free, err := DecodeBid(fx[BidNSID+"-free"])
	if err != nil {
		t.Fatal(err)
	}
	if free.Payload.BidsFree == nil || *free.Payload.BidsFree.Reason != "community" {
		t.Fatalf("free payload: %+v", free.Payload)
	}

	// A member this package does not know stays as it was (open union).
	other := []byte(`{"$type":"com.publicdomainrelay.temp.market.bid","rfp":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/com.publicdomainrelay.temp.market.rfp/3jzfcijpj2z2a","cid":"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a"},"payload":{"$type":"com.example.bids.barter","goods":["eggs"]}}`)
	b, err := DecodeBid(other)
	if err != nil {
		t.Fatal(err)
	}
	if b.Payload.Other == nil || b.Payload.Type() != "com.example.bids.barter" {
		t.Fatalf("other payload: %+v", b.Payload)
	}
	lextest.RoundTrip(t, other, new(Bid))

	ev := lextest.Fixtures(t, fixtures, EventNSID)
	for name, want := range map[string]string{
		EventNSID:              ComputeEventsVMOnNetworkNSID,
		EventNSID + "-started": ComputeEventsVMStartedNSID,
		EventNSID + "-delete":  ComputeEventsVMDeleteNSID,
	} {
		e, err := DecodeEvent(ev[name])
		if err != nil {
			t.Fatal(err)
		}
		if e.Payload.Type() != want {
			t.Errorf("%s: payload %s, want %s", name, e.Payload.Type(), want)
		}
	}

	// Built in Go: the member writes its $type.
	rec := Event{
		Receipt: atrepo.StrongRef{URI: "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/com.publicdomainrelay.temp.market.receipt/3jzfcijpj2z2a", CID: "bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a"},
		Payload: EventPayload{ComputeEventsVMOnNetwork: &ComputeEventsVMOnNetwork{Address: "10.0.0.9"}},
	}
	if err := rec.Validate(); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(rec.Payload)
	lextest.SameJSON(t, out, []byte(`{"$type":"com.publicdomainrelay.temp.market.compute.events.vm.onNetwork","address":"10.0.0.9"}`))
	if _, err := json.Marshal(Event{Receipt: rec.Receipt}); err == nil {
		t.Fatal("an empty union encoded")
	}
	var p BidPayload
	if err := json.Unmarshal([]byte(`{"cost":1}`), &p); err == nil {
		t.Fatal("a union member without $type decoded")
	}
}

func TestDecodeReportsWhy(t *testing.T) {
	_, err := DecodeBid([]byte(`{"$type":"com.publicdomainrelay.temp.market.bid","rfp":{"uri":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/a.b.c/1","cid":"bafyreidfayvfuwqa7qlnopdjiqrxzs6blmoeu4rujcjtnci5beludirz2a"},"payload":{"$type":"com.publicdomainrelay.temp.market.bids.priced","cost":"cheap","currency":"USD","frequency":"hour"}}`))
	if lexicons.ReasonOf(err) != lexicons.WrongType {
		t.Fatalf("cost as string: %v", err)
	}
	if _, err := DecodeRFP([]byte(`{"$type":"com.publicdomainrelay.temp.market.bid"}`)); lexicons.ReasonOf(err) != lexicons.BadType {
		t.Fatalf("wrong $type: %v", err)
	}
	if _, err := DecodeComputeVM([]byte(`{"$type":"com.publicdomainrelay.temp.market.compute.vm","cpus":2}`)); lexicons.ReasonOf(err) != lexicons.MissingField {
		t.Fatalf("missing mem: %v", err)
	}
}

func TestDeliverSecretsRoundTrip(t *testing.T) {
	for name, tc := range map[string]struct {
		json string
		v    any
	}{
		"input":  {`{"accept":"at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/com.publicdomainrelay.temp.market.accept/3jzfcijpj2z2a","secrets":[{"name":"token","value":"c2VjcmV0"}]}`, new(DeliverSecretsInput)},
		"output": {`{"delivered":1}`, new(DeliverSecretsOutput)},
	} {
		t.Run(name, func(t *testing.T) { lextest.RoundTrip(t, []byte(tc.json), tc.v) })
	}
	vm, err := DecodeComputeVM(lextest.Fixtures(t, fixtures, ComputeVMNSID)[ComputeVMNSID])
	if err != nil || len(vm.Secrets) != 2 || vm.Secrets[0] != "token" {
		t.Fatalf("compute.vm secrets: %+v %v", vm, err)
	}
}
