package computecontract

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
)

// Index is what the requester has learnt from the firehoses it follows: offerings, bids by
// rfp, receipts by accept, events by receipt. It follows each source once and wakes the
// contracts a record concerns. The records an event names are read from the source that
// carried the event.
//
// With a Store, what it holds is kept together with the seq it has handled of each source
// (Keep, every FlushEvery while it changes), and a restarted process starts from that
// (Restore): it resumes each source after its saved cursor, knowing the offerings and the
// bids of open windows that came before it, instead of replaying every source from seq 0.
// Without one, every source is followed from 0.
type Index struct {
	Log *slog.Logger
	// Wake is called with the contract a new record concerns.
	Wake func(types.NamespacedName)

	mu        sync.Mutex
	following map[string]*follower
	offers    map[string]offering              // DID -> its offering as last seen
	bids      map[string]map[string]market.Bid // rfp uri -> bid uri -> bid
	receipts  map[string][]market.ReceiptSeen  // accept uri -> receipts
	events    map[string][]seenEvent           // receipt uri -> events
	owners    map[string]types.NamespacedName  // rfp/accept/receipt uri -> contract
	// cursors is the last seq handled of each source (feed.Source.CursorKey).
	cursors map[string]int64
	// touched is when the entry of an rfp, accept or receipt uri was last written: one no
	// contract owns is dropped unownedKeep after (a deleted contract's, another requester's).
	touched map[string]time.Time
	dirty   bool
	// restoring holds followers back until Restore ran, so none replays from 0 what the
	// saved cursor skips.
	restoring bool
}

// offering is what the index keeps of a bidder's offering.
type offering struct {
	Live      bool               `json:"live"` // applies to compute.vm
	Endpoint  string             `json:"endpoint,omitempty"`
	Kinds     []string           `json:"kinds,omitempty"` // substrates; none: any
	Isolation []market.Isolation `json:"isolation,omitempty"`
	Archs     []string           `json:"archs,omitempty"`
}

type seenEvent struct {
	URI    string `json:"uri"`
	Author string `json:"author"`
	Kind   string `json:"kind"`
	// Address and Ports are a vm.onNetwork event's.
	Address string                                   `json:"address,omitempty"`
	Ports   []mk.ComputeEventsVMOnNetworkPortBinding `json:"ports,omitempty"`
	// Reason is a vm.delete event's.
	Reason string `json:"reason,omitempty"`
}

// catchUpQuiet is how long a follower's replay must pause before it counts as caught up.
const catchUpQuiet = 250 * time.Millisecond

// follower is one PDS followed. It is caught up once it has handled the event that was the
// newest when it started, where the firehose can say which (repos.HeadSource: the embedded
// PDS's); else once it has handled an event committed after it started, or once the replay
// has been quiet for catchUpQuiet. Until then what the index holds may miss records, and no
// contract decides on it.
type follower struct {
	start time.Time
	ready chan struct{}
	once  sync.Once
	timer *time.Timer
}

func (f *follower) markReady() { f.once.Do(func() { close(f.ready) }) }

func (f *follower) isReady() bool {
	select {
	case <-f.ready:
		return true
	default:
		return false
	}
}

// Follow starts following src unless its endpoint is followed already, after the seq
// saved for it (none: from 0). Before Restore ran it does nothing: the caller's CaughtUp is
// false and it asks again.
func (x *Index) Follow(ctx context.Context, src feed.Source) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	if x.restoring || x.following[src.Endpoint] != nil {
		return
	}
	key := src.CursorKey()
	cursor := x.cursors[key]
	f := &follower{start: time.Now(), ready: make(chan struct{})}
	head, exact := feed.HeadOf(ctx, src.Events)
	switch {
	case exact && (head == cursor || head == 0):
		f.markReady() // nothing to replay
	case !exact:
		f.timer = time.AfterFunc(catchUpQuiet, f.markReady)
	}
	if cursor > 0 {
		x.logger().Info("following from a saved cursor", "source", key, "cursor", cursor)
	}
	x.following[src.Endpoint] = f
	go feed.Follow(ctx, src.Events, cursor, func(ev repos.Event) {
		x.handle(ctx, src.Fetch, ev)
		x.mu.Lock()
		x.cursors[key], x.dirty = ev.Seq, true
		x.mu.Unlock()
		switch {
		case f.isReady():
		case exact:
			// A source behind the saved cursor was started afresh: feed.Follow replays it
			// from 0, up to its head.
			if ev.Seq >= head {
				f.markReady()
			}
		case ev.Time.After(f.start):
			f.markReady()
		default:
			f.timer.Reset(catchUpQuiet)
		}
	})
}

// CaughtUp says whether the follower of endpoint, and every other source followed, has
// replayed what its PDS held when it started: a bid or an offering seen on another source
// decides a window as much as one on the requester's own PDS.
func (x *Index) CaughtUp(endpoint string) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.following[endpoint] == nil {
		return false
	}
	for _, f := range x.following {
		if !f.isReady() {
			return false
		}
	}
	return true
}

func (x *Index) logger() *slog.Logger {
	if x.Log == nil {
		return slog.Default()
	}
	return x.Log
}

func (x *Index) init() {
	if x.following == nil {
		x.following, x.offers = map[string]*follower{}, map[string]offering{}
		x.bids, x.receipts = map[string]map[string]market.Bid{}, map[string][]market.ReceiptSeen{}
		x.events, x.owners = map[string][]seenEvent{}, map[string]types.NamespacedName{}
		x.cursors, x.touched = map[string]int64{}, map[string]time.Time{}
	}
}

// Own says that uri (an rfp, accept or receipt) belongs to contract key.
func (x *Index) Own(uri string, key types.NamespacedName) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	x.owners[uri] = key
}

func (x *Index) wake(uri string) {
	x.mu.Lock()
	key, ok := x.owners[uri]
	x.mu.Unlock()
	if ok && x.Wake != nil {
		x.Wake(key)
	}
}

func (x *Index) handle(ctx context.Context, fetch feed.Fetcher, ev repos.Event) {
	for _, op := range ev.Ops {
		uri := feed.URI(ev.DID, op.Collection, op.RKey)
		switch op.Collection {
		case mk.OfferingNSID:
			x.onOffering(ctx, fetch, ev.DID, uri, op.Action)
		case mk.BidNSID, mk.ReceiptNSID, mk.EventNSID:
			if op.Action == "delete" {
				continue
			}
			rec, err := fetch.Get(ctx, uri)
			if err != nil {
				x.logger().Debug("market record unreadable", "uri", uri, "err", err)
				continue
			}
			x.record(ev.DID, op.Collection, rec)
		}
	}
}

func (x *Index) onOffering(ctx context.Context, fetch feed.Fetcher, did, uri, action string) {
	var o offering
	if action != "delete" {
		if rec, err := fetch.Get(ctx, uri); err == nil {
			if d, err := mk.DecodeOffering(rec.Value); err == nil {
				o.Endpoint, o.Kinds, o.Archs = d.EndpointURL, d.Substrates, d.Architectures
				for _, e := range d.Isolation {
					o.Isolation = append(o.Isolation, market.Isolation{Substrate: e.Substrate, Boundary: market.Boundary(e.Boundary), Layers: e.Layers})
				}
				o.Live = slices.Contains(d.AppliesTo, mk.ComputeVMNSID)
			}
		}
	}
	x.mu.Lock()
	x.offers[did] = o
	x.dirty = true
	var keys []types.NamespacedName
	for _, k := range x.owners { // the bidder set of every contract may have changed
		keys = append(keys, k)
	}
	x.mu.Unlock()
	for _, k := range keys {
		if x.Wake != nil {
			x.Wake(k)
		}
	}
}

func (x *Index) record(did, coll string, rec *repos.Record) {
	switch coll {
	case mk.BidNSID:
		var b mk.Bid
		if json.Unmarshal(rec.Value, &b) != nil {
			return
		}
		seen := market.Bid{URI: rec.URI, CID: rec.CID, Bidder: did}
		switch {
		case b.Payload.BidsFree != nil:
			seen.Free = true
		case b.Payload.BidsPriced != nil:
			seen.Cost, seen.Currency = b.Payload.BidsPriced.Cost, b.Payload.BidsPriced.Currency
		default:
			seen.Unknown = true
		}
		if b.Size != nil {
			seen.Size = &market.Size{CPUs: b.Size.Cpus, MemMiB: b.Size.MemMiB}
		}
		x.mu.Lock()
		if x.bids[b.RFP.URI] == nil {
			x.bids[b.RFP.URI] = map[string]market.Bid{}
		}
		x.bids[b.RFP.URI][rec.URI] = seen
		x.wrote(b.RFP.URI)
		x.mu.Unlock()
		x.wake(b.RFP.URI)
	case mk.ReceiptNSID:
		var r mk.Receipt
		if json.Unmarshal(rec.Value, &r) != nil {
			return
		}
		seen := market.ReceiptSeen{URI: rec.URI, CID: rec.CID, Author: did,
			Accept: market.Ref{URI: r.Accept.URI, CID: r.Accept.CID}, AcceptCID: r.CID}
		x.mu.Lock()
		// A source replayed from a saved cursor may carry a receipt the index holds already.
		if i := slices.IndexFunc(x.receipts[r.Accept.URI], func(s market.ReceiptSeen) bool { return s.URI == rec.URI }); i >= 0 {
			x.receipts[r.Accept.URI][i] = seen
		} else {
			x.receipts[r.Accept.URI] = append(x.receipts[r.Accept.URI], seen)
		}
		x.wrote(r.Accept.URI)
		x.mu.Unlock()
		x.wake(r.Accept.URI)
	case mk.EventNSID:
		var e mk.Event
		if json.Unmarshal(rec.Value, &e) != nil {
			return
		}
		se := seenEvent{URI: rec.URI, Author: did, Kind: e.Payload.Type()}
		if n := e.Payload.ComputeEventsVMOnNetwork; n != nil {
			se.Address, se.Ports = n.Address, n.Ports
		}
		if d := e.Payload.ComputeEventsVMDelete; d != nil && d.Reason != nil {
			se.Reason = *d.Reason
		}
		x.mu.Lock()
		if i := slices.IndexFunc(x.events[e.Receipt.URI], func(s seenEvent) bool { return s.URI == rec.URI }); i >= 0 {
			x.events[e.Receipt.URI][i] = se
		} else {
			x.events[e.Receipt.URI] = append(x.events[e.Receipt.URI], se)
		}
		x.wrote(e.Receipt.URI)
		x.mu.Unlock()
		x.wake(e.Receipt.URI)
	}
}

// Offerings are the DIDs with a live compute.vm offering for guests of kind: one that lists
// kind among its substrates, or lists none (an offering without the field serves any).
func (x *Index) Offerings(kind string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for d, o := range x.offers {
		if o.Live && (len(o.Kinds) == 0 || slices.Contains(o.Kinds, kind)) {
			out = append(out, d)
		}
	}
	return out
}

// Stated is the isolation boundary each live offering states for guests of kind
// (market.BoundaryNone for one that states nothing about kind).
func (x *Index) Stated(kind string) map[string]market.Boundary {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string]market.Boundary{}
	for d, o := range x.offers {
		if o.Live {
			out[d] = market.StatedBoundary(o.Isolation, kind)
		}
	}
	return out
}

// StatedLayers are the isolation layers each live offering states for guests of kind.
func (x *Index) StatedLayers(kind string) map[string][]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]string{}
	for d, o := range x.offers {
		if o.Live {
			out[d] = market.StatedLayers(o.Isolation, kind)
		}
	}
	return out
}

// StatedArchs are the architectures each live offering states.
func (x *Index) StatedArchs() map[string][]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]string{}
	for d, o := range x.offers {
		if o.Live {
			out[d] = slices.Clone(o.Archs)
		}
	}
	return out
}

// Endpoint is the endpointUrl of did's offering ("" when none was seen).
func (x *Index) Endpoint(did string) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.offers[did].Endpoint
}

// Bids on an rfp.
func (x *Index) Bids(rfp string) []market.Bid {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []market.Bid
	for _, b := range x.bids[rfp] {
		out = append(out, b)
	}
	return out
}

// Receipts for an accept.
func (x *Index) Receipts(accept string) []market.ReceiptSeen {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]market.ReceiptSeen(nil), x.receipts[accept]...)
}

// Events on a receipt.
func (x *Index) Events(receipt string) []seenEvent {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]seenEvent(nil), x.events[receipt]...)
}
