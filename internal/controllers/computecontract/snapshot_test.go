package computecontract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
)

// marketRecords is a fetcher over a fixed set of records, by URI.
type marketRecords map[string]any

func (m marketRecords) fetch(_ context.Context, did, collection, rkey string) (*repos.Record, error) {
	uri := feed.URI(did, collection, rkey)
	v, ok := m[uri]
	if !ok {
		return nil, errors.New("no such record")
	}
	raw, err := json.Marshal(v)
	return &repos.Record{URI: uri, CID: "cid-" + rkey, Value: raw}, err
}

// recordingSource is a firehose of the events evs (seqs from 1), saying its head, that
// remembers the cursor each subscription asked for.
type recordingSource struct {
	evs []repos.Event

	mu      sync.Mutex
	asked   []int64
	handled chan int64
}

func (s *recordingSource) Head(context.Context) (int64, error) { return int64(len(s.evs)), nil }

func (s *recordingSource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	s.mu.Lock()
	s.asked = append(s.asked, *cursor)
	s.mu.Unlock()
	for _, ev := range s.evs {
		if ev.Seq <= *cursor {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
		s.handled <- ev.Seq
	}
	<-ctx.Done()
	return ctx.Err()
}

// A requester restarted from its kept index resumes each source after the seq it saved, and
// still knows the offering and the bids that came before it: the window of an open rfp is
// decided on every bid, not only on those after the restart. A source replayed over what
// the snapshot holds (a crash after a handle, before the save) duplicates nothing.
func TestIndexRestartsFromItsSnapshot(t *testing.T) {
	const (
		bidder = "did:plc:bidder"
		req    = "did:plc:req"
	)
	rfp := atrepo.StrongRef{URI: feed.URI(req, mk.RFPNSID, "r1"), CID: "c"}
	accept := atrepo.StrongRef{URI: feed.URI(req, mk.AcceptNSID, "a1"), CID: "c"}
	recs := marketRecords{
		feed.URI(bidder, mk.OfferingNSID, "self"): mk.Offering{AppliesTo: []string{mk.ComputeVMNSID}, Substrates: []string{"deno"},
			CreatedAt: "2026-12-05T00:00:00Z", EndpointURL: "http://127.0.0.1:1"},
		feed.URI(bidder, mk.BidNSID, "b1"):     mk.Bid{RFP: rfp, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}},
		feed.URI(bidder, mk.ReceiptNSID, "c1"): mk.Receipt{Accept: accept, CID: "c"},
	}
	op := func(seq int64, coll, rkey string) repos.Event {
		return repos.Event{Seq: seq, DID: bidder, Time: time.Now().Add(-time.Hour), Ops: []repos.Op{{Action: "create", Collection: coll, RKey: rkey}}}
	}
	src := &recordingSource{handled: make(chan int64, 16), evs: []repos.Event{
		op(1, mk.OfferingNSID, "self"), op(2, mk.BidNSID, "b1"), op(3, mk.ReceiptNSID, "c1")}}
	const endpoint = "http://relay.test/"
	contract := types.NamespacedName{Namespace: "default", Name: "web"}

	// The first run sees the offering and the bid, and is stopped.
	ctx, stop := context.WithCancel(context.Background())
	first := &Index{}
	first.Restore(nil, time.Now())
	first.Own(rfp.URI, contract)
	first.Follow(ctx, feed.Source{Endpoint: endpoint, Events: &recordingSource{handled: src.handled, evs: src.evs[:2]}, Fetch: recs.fetch})
	for range 2 {
		<-src.handled
	}
	stop()
	snap, changed := first.snapshot(time.Now())
	if !changed {
		t.Fatal("a snapshot after two events handled says nothing changed")
	}
	raw, err := encodeSnapshot(snap)
	if err != nil {
		t.Fatal(err)
	}
	kept, err := decodeSnapshot(raw)
	if err != nil {
		t.Fatal(err)
	}
	if kept.Cursors[feed.CursorKey(endpoint)] != 2 {
		t.Fatalf("saved cursors %v, want %s at 2", kept.Cursors, feed.CursorKey(endpoint))
	}

	// The second run starts from it, before its contract has owned the rfp again.
	ctx, stop = context.WithCancel(context.Background())
	defer stop()
	second := &Index{restoring: true}
	second.Follow(ctx, feed.Source{Endpoint: endpoint, Events: src, Fetch: recs.fetch})
	if second.CaughtUp(endpoint) {
		t.Fatal("a follower started before Restore")
	}
	second.Restore(kept, time.Now())
	second.Follow(ctx, feed.Source{Endpoint: endpoint, Events: src, Fetch: recs.fetch})
	if got := <-src.handled; got != 3 {
		t.Fatalf("the restarted follower handled seq %d first, want 3 (after the saved cursor)", got)
	}
	src.mu.Lock()
	asked := slices.Clone(src.asked)
	src.mu.Unlock()
	if !slices.Equal(asked, []int64{2}) {
		t.Fatalf("subscriptions asked from %v, want [2]", asked)
	}
	if got := second.Offerings("deno"); !slices.Equal(got, []string{bidder}) {
		t.Errorf("offerings after the restart: %v, want the one seen before it", got)
	}
	if got := second.Endpoint(bidder); got != "http://127.0.0.1:1" {
		t.Errorf("the offering's endpoint after the restart: %q", got)
	}
	if got := second.Bids(rfp.URI); len(got) != 1 || got[0].Bidder != bidder || !got[0].Free {
		t.Errorf("bids on the open rfp after the restart: %+v, want the free bid seen before it", got)
	}
	if got := second.Receipts(accept.URI); len(got) != 1 {
		t.Errorf("receipts after the restart: %+v, want the one after the cursor", got)
	}

	// A replay over what the index holds (seq 3 again) keeps one receipt.
	second.handle(ctx, recs.fetch, src.evs[2])
	if got := second.Receipts(accept.URI); len(got) != 1 {
		t.Errorf("receipts after seq 3 was handled twice: %d, want 1", len(got))
	}
}

func TestKeepEntry(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		owned   bool
		touched time.Time
		want    bool
	}{
		{"owned, long ago", true, now.Add(-24 * time.Hour), true},
		{"unowned, just written", false, now.Add(-time.Second), true},
		{"unowned, just under the keep", false, now.Add(-unownedKeep + time.Second), true},
		{"unowned, past the keep", false, now.Add(-unownedKeep), false},
		{"unowned, never written", false, time.Time{}, false},
	} {
		if got := keepEntry(tc.owned, tc.touched, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// What no contract owns goes unownedKeep after it was last written, from memory and from the
// snapshot; a restored entry gets unownedKeep from the restore for its contract to own it
// again; a forgotten contract's entries are no longer owned.
func TestSnapshotDropsWhatNoContractOwns(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	mine, theirs := "at://did:plc:me/"+mk.RFPNSID+"/r1", "at://did:plc:other/"+mk.RFPNSID+"/r9"
	key := types.NamespacedName{Namespace: "default", Name: "web"}
	x := &Index{}
	x.init()
	for _, rfp := range []string{mine, theirs} {
		x.bids[rfp] = map[string]market.Bid{"b": {URI: "b"}}
		x.touched[rfp] = now
	}
	x.Own(mine, key)
	s, _ := x.snapshot(now.Add(unownedKeep))
	if _, ok := s.Bids[mine]; !ok {
		t.Error("an owned rfp's bids were dropped")
	}
	if _, ok := s.Bids[theirs]; ok || len(x.Bids(theirs)) != 0 {
		t.Error("bids on an rfp no contract owns were kept past unownedKeep")
	}

	restored := &Index{}
	restored.Restore(s, now.Add(time.Hour))
	if s, _ := restored.snapshot(now.Add(time.Hour + unownedKeep - time.Second)); len(s.Bids[mine]) != 1 {
		t.Error("a restored entry was dropped before its contract could own it again")
	}
	x.Forget(key)
	if s, _ := x.snapshot(now.Add(2 * unownedKeep)); len(s.Bids) != 0 {
		t.Errorf("a forgotten contract's bids were kept: %v", s.Bids)
	}
}

// A snapshot too large for a Secret is refused with its size, not written truncated; one of
// another version, or not a snapshot, is refused when read.
func TestSnapshotEncoding(t *testing.T) {
	big := &IndexSnapshot{Version: snapshotVersion, Bids: map[string][]market.Bid{}}
	rnd := rand.New(rand.NewPCG(1, 2))
	hex := func() string { return fmt.Sprintf("%016x%016x", rnd.Uint64(), rnd.Uint64()) }
	for range 20000 {
		// Random values, as DIDs, record keys and CIDs are to gzip.
		big.Bids["at://did:plc:"+hex()+"/r/"+hex()] = []market.Bid{{URI: "at://did:plc:" + hex() + "/bid/" + hex(), CID: "bafy" + hex()}}
	}
	var tooLarge *SnapshotTooLargeError
	if _, err := encodeSnapshot(big); !errors.As(err, &tooLarge) {
		t.Fatalf("a %d-entry snapshot: %v, want SnapshotTooLargeError", len(big.Bids), err)
	}
	other, err := encodeSnapshot(&IndexSnapshot{Version: snapshotVersion + 1})
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{"another version": other, "not gzip": []byte("{}")} {
		if _, err := decodeSnapshot(raw); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if s, err := decodeSnapshot(nil); s != nil || err != nil {
		t.Errorf("an empty Secret: %v, %v; want no snapshot", s, err)
	}
	small := &IndexSnapshot{Version: snapshotVersion, Cursors: map[string]int64{"http://relay.test": 42},
		Offerings: map[string]offering{"did:plc:b": {Live: true, Kinds: []string{"deno"}, Isolation: []market.Isolation{{Substrate: "deno", Boundary: market.BoundaryProcess}}}},
		Events:    map[string][]seenEvent{"at://r": {{URI: "at://e", Kind: "vm.onNetwork", Ports: []mk.ComputeEventsVMOnNetworkPortBinding{{Guest: 80, Host: 8080, Name: "web"}}}}}}
	raw, err := encodeSnapshot(small)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeSnapshot(raw)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(small, back); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}
