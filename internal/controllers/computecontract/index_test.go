package computecontract

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
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

// The index keeps what each offering states about isolation per kind: the boundary of the
// entry for that kind, none for an offering without entries (an older bidder) or without one
// for the kind, and nothing once the offering is deleted.
func TestStatedIsolation(t *testing.T) {
	at := "2026-12-02T00:00:00Z"
	offerings := map[string]mk.Offering{
		"did:plc:deno": {AppliesTo: []string{mk.ComputeVMNSID}, Substrates: []string{"deno"}, CreatedAt: at, EndpointURL: "http://127.0.0.1:1",
			Isolation: []mk.OfferingIsolation{{Substrate: "deno", Boundary: "process", Layers: []string{"deno-permissions"}}}},
		"did:plc:vm": {AppliesTo: []string{mk.ComputeVMNSID}, CreatedAt: at, EndpointURL: "http://127.0.0.1:2",
			Isolation: []mk.OfferingIsolation{{Substrate: "deno", Boundary: "vm"}, {Substrate: "node", Boundary: "namespace"}}},
		"did:plc:old": {AppliesTo: []string{mk.ComputeVMNSID}, CreatedAt: at, EndpointURL: "http://127.0.0.1:3"},
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
	want := map[string]map[string]market.Boundary{
		"deno": {"did:plc:deno": market.BoundaryProcess, "did:plc:vm": market.BoundaryVM, "did:plc:old": market.BoundaryNone},
		"node": {"did:plc:deno": market.BoundaryNone, "did:plc:vm": market.BoundaryNamespace, "did:plc:old": market.BoundaryNone},
	}
	for kind, w := range want {
		if got := x.Stated(kind); !maps.Equal(got, w) {
			t.Errorf("Stated(%s) = %v, want %v", kind, got, w)
		}
	}
	x.onOffering(context.Background(), fetch, "did:plc:vm", "at://did:plc:vm/"+mk.OfferingNSID+"/self", "delete")
	if got := x.Stated("deno"); got["did:plc:vm"] != market.BoundaryNone {
		t.Errorf("after the vm bidder's offering was deleted: %v", got)
	}
}

// pausedSource is a firehose of seqs 1..n that falls silent for pause after seq pauseAfter;
// headed, it says its newest seq (repos.HeadSource) as the embedded PDS's does.
type pausedSource struct {
	n, pauseAfter int64
	pause         time.Duration
}

func (s pausedSource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	for seq := int64(1); seq <= s.n; seq++ {
		if cursor != nil && seq <= *cursor {
			continue
		}
		// Committed before the follower started: only the newest seq or the quiet end it.
		if err := fn(repos.Event{Seq: seq, DID: "did:plc:someone", Time: time.Now().Add(-time.Hour)}); err != nil {
			return err
		}
		if seq == s.pauseAfter {
			time.Sleep(s.pause)
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

type headedPausedSource struct{ pausedSource }

func (s headedPausedSource) Head(context.Context) (int64, error) { return s.n, nil }

// A follower is caught up once it has handled the newest seq where its firehose can say it,
// however long the replay falls silent on the way; else once the replay is quiet.
func TestFollowerCatchUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	paused := pausedSource{n: 3, pauseAfter: 2, pause: 4 * catchUpQuiet}
	var empty repos.EventSource = headedPausedSource{pausedSource{n: 0}}
	for _, tc := range []struct {
		name            string
		src             repos.EventSource
		midway, settled bool // caught up 2 quiet periods into the pause; after it
	}{
		{"newest seq known", headedPausedSource{paused}, false, true},
		{"newest seq known, nothing to replay", empty, true, true},
		{"no newest seq: the quiet ends the replay", paused, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := &Index{}
			x.Follow(ctx, feed.Source{Endpoint: tc.name, Events: tc.src})
			time.Sleep(2 * catchUpQuiet)
			if got := x.CaughtUp(tc.name); got != tc.midway {
				t.Errorf("caught up during the pause: %v, want %v", got, tc.midway)
			}
			time.Sleep(3 * catchUpQuiet)
			if got := x.CaughtUp(tc.name); got != tc.settled {
				t.Errorf("caught up after the last event: %v, want %v", got, tc.settled)
			}
		})
	}
}

// The index keeps the size a bid states (nil when it states none), so that the window's
// close can refuse a bid for less than the rfp asks.
func TestBidSize(t *testing.T) {
	rfp := atrepo.StrongRef{URI: "at://did:plc:req/" + mk.RFPNSID + "/r1", CID: "c"}
	x := &Index{}
	x.init()
	for _, b := range []struct {
		did  string
		size *mk.BidSize
	}{{"did:plc:sized", &mk.BidSize{Cpus: 2, MemMiB: 512}}, {"did:plc:unsized", nil}} {
		raw, err := json.Marshal(mk.Bid{RFP: rfp, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}, Size: b.size})
		if err != nil {
			t.Fatal(err)
		}
		x.record(b.did, mk.BidNSID, &repos.Record{URI: "at://" + b.did + "/" + mk.BidNSID + "/b1", CID: "c", Value: raw})
	}
	got := map[string]*market.Size{}
	for _, b := range x.Bids(rfp.URI) {
		got[b.Bidder] = b.Size
	}
	want := map[string]*market.Size{"did:plc:sized": {CPUs: 2, MemMiB: 512}, "did:plc:unsized": nil}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("sizes (-want +got):\n%s", d)
	}
}
