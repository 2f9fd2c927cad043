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
// rfp, receipts by accept, events by receipt. It follows each PDS once (from seq 0, so a
// restarted process learns everything again) and wakes the contracts a record concerns.
// The records an event names are read from the source that carried the event.
type Index struct {
	Log *slog.Logger
	// Wake is called with the contract a new record concerns.
	Wake func(types.NamespacedName)

	mu        sync.Mutex
	following map[string]*follower
	offerings map[string]bool                  // DID -> live offering for compute.vm
	endpoints map[string]string                // DID -> its offering's endpointUrl
	kinds     map[string][]string              // DID -> its offering's substrates (none: any)
	isolation map[string][]market.Isolation    // DID -> its offering's isolation entries
	archs     map[string][]string              // DID -> its offering's architectures
	bids      map[string]map[string]market.Bid // rfp uri -> bid uri -> bid
	receipts  map[string][]market.ReceiptSeen  // accept uri -> receipts
	events    map[string][]seenEvent           // receipt uri -> events
	owners    map[string]types.NamespacedName  // rfp/accept/receipt uri -> contract
}

type seenEvent struct {
	URI, Author, Kind string
	// Address and Ports are a vm.onNetwork event's.
	Address string
	Ports   []mk.ComputeEventsVMOnNetworkPortBinding
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

// Follow starts following src unless its endpoint is followed already.
func (x *Index) Follow(ctx context.Context, src feed.Source) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.init()
	if x.following[src.Endpoint] != nil {
		return
	}
	f := &follower{start: time.Now(), ready: make(chan struct{})}
	head, exact := feed.HeadOf(ctx, src.Events)
	switch {
	case exact && head == 0:
		f.markReady() // nothing to replay
	case !exact:
		f.timer = time.AfterFunc(catchUpQuiet, f.markReady)
	}
	x.following[src.Endpoint] = f
	go feed.Follow(ctx, src.Events, 0, func(ev repos.Event) {
		x.handle(ctx, src.Fetch, ev)
		switch {
		case f.isReady():
		case exact:
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

func (x *Index) init() {
	if x.following == nil {
		x.following, x.offerings, x.endpoints, x.kinds = map[string]*follower{}, map[string]bool{}, map[string]string{}, map[string][]string{}
		x.isolation = map[string][]market.Isolation{}
		x.archs = map[string][]string{}
		x.bids, x.receipts = map[string]map[string]market.Bid{}, map[string][]market.ReceiptSeen{}
		x.events, x.owners = map[string][]seenEvent{}, map[string]types.NamespacedName{}
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
				x.Log.Debug("market record unreadable", "uri", uri, "err", err)
				continue
			}
			x.record(ev.DID, op.Collection, rec)
		}
	}
}

func (x *Index) onOffering(ctx context.Context, fetch feed.Fetcher, did, uri, action string) {
	live, endpoint := false, ""
	var kinds []string
	var iso []market.Isolation
	var archs []string
	if action != "delete" {
		if rec, err := fetch.Get(ctx, uri); err == nil {
			if o, err := mk.DecodeOffering(rec.Value); err == nil {
				endpoint, kinds, archs = o.EndpointURL, o.Substrates, o.Architectures
				for _, e := range o.Isolation {
					iso = append(iso, market.Isolation{Substrate: e.Substrate, Boundary: market.Boundary(e.Boundary), Layers: e.Layers})
				}
				for _, a := range o.AppliesTo {
					live = live || a == mk.ComputeVMNSID
				}
			}
		}
	}
	x.mu.Lock()
	x.offerings[did] = live
	x.endpoints[did] = endpoint
	x.kinds[did] = kinds
	x.isolation[did] = iso
	x.archs[did] = archs
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
		x.mu.Unlock()
		x.wake(b.RFP.URI)
	case mk.ReceiptNSID:
		var r mk.Receipt
		if json.Unmarshal(rec.Value, &r) != nil {
			return
		}
		x.mu.Lock()
		x.receipts[r.Accept.URI] = append(x.receipts[r.Accept.URI], market.ReceiptSeen{URI: rec.URI, CID: rec.CID, Author: did,
			Accept: market.Ref{URI: r.Accept.URI, CID: r.Accept.CID}, AcceptCID: r.CID})
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
		x.mu.Lock()
		x.events[e.Receipt.URI] = append(x.events[e.Receipt.URI], se)
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
	for d, live := range x.offerings {
		if k := x.kinds[d]; live && (len(k) == 0 || slices.Contains(k, kind)) {
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
	for d, live := range x.offerings {
		if live {
			out[d] = market.StatedBoundary(x.isolation[d], kind)
		}
	}
	return out
}

// StatedLayers are the isolation layers each live offering states for guests of kind.
func (x *Index) StatedLayers(kind string) map[string][]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]string{}
	for d, live := range x.offerings {
		if live {
			out[d] = market.StatedLayers(x.isolation[d], kind)
		}
	}
	return out
}

// StatedArchs are the architectures each live offering states.
func (x *Index) StatedArchs() map[string][]string {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := map[string][]string{}
	for d, live := range x.offerings {
		if live {
			out[d] = slices.Clone(x.archs[d])
		}
	}
	return out
}

// Endpoint is the endpointUrl of did's offering ("" when none was seen).
func (x *Index) Endpoint(did string) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.endpoints[did]
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
