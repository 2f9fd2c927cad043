// Package bidder is a market bidder: it offers compute from its own repo, bids on rfps its
// policy and capacity allow, boots the guest of an accepted bid on a substrate, and reports
// the guest's life in events on the receipt. Everything it knows is in its repo and its
// substrate's state dir, so a restarted bidder carries on where it stopped.
package bidder

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"k8s.io/utils/clock"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/hostcap"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/serviceauth"
	"socialweb.computer/internal/substrate"
)

// Config of a bidder.
type Config struct {
	// Repo is the bidder's own repo; Fetch reads the records of others on its PDS.
	Repo  repos.Repo
	Fetch feed.Fetcher
	// Sources are firehoses followed besides its PDS's (requesters' PDSes, or a relay), each
	// with the reader of the records its events name.
	Sources []feed.Source
	// Substrate runs the guests (its Kind is the computeKind served).
	Substrate substrate.Substrate
	// Cost, CostPerCPU and CostPerGiB price a bid per hour in the smallest unit of
	// Currency, by the size the rfp asks: Cost per guest, plus CostPerCPU for each CPU and
	// CostPerGiB for each GiB of memory (market.Pricing). Free bids bids.free.
	Cost       int64
	CostPerCPU int64
	CostPerGiB int64
	Currency   string
	Free       bool
	// Capacity is how many guests it runs at once (0: 8).
	Capacity int
	// MaxGuestCPUs and MaxGuestMemMiB are the largest guest it runs (0: the host's CPUs
	// and memory). It does not bid on a payload asking for more: a guest larger than its
	// host would get less than its contract (a node would advertise less than it was
	// rented at).
	MaxGuestCPUs, MaxGuestMemMiB int
	// ReadyTimeout bounds the wait for a booted guest to run (0: 60 s), and the wait for the
	// secrets of a contract that names some.
	ReadyTimeout time.Duration
	// FetchTimeout bounds the reads an rfp's evaluation makes (its payload and policy
	// records, from the requester's PDS) (0: 30 s): a PDS that never answers costs a bid,
	// not a bidder's goroutine.
	FetchTimeout time.Duration
	// Directory resolves requesters' DIDs to their keys, to verify the service-auth token of
	// a deliverSecrets call. With it the bidder serves deliverSecrets on Listen (default
	// 127.0.0.1:0) and publishes that URL as its offering's endpointUrl; without it it serves
	// nothing, publishes its PDS, and does not bid on rfps whose payload names secrets.
	Directory identity.Directory
	Listen    string
	// TLSCertFile and TLSKeyFile, both or neither, make the secrets endpoint serve https with
	// that certificate (read again when the files change, so a renewal needs no restart).
	// Requesters send secrets over plain http to a loopback host only: a bidder reached from
	// other hosts serves https, or publishes an https PublicURL of a proxy in front of Listen.
	TLSCertFile, TLSKeyFile string
	// PublicURL is the endpointUrl published in the offering when it is not Listen's address
	// (a TLS proxy, a host name, a forwarded port).
	PublicURL string
	// StateDir is where the bidder keeps what it must remember across its own restart and
	// that no record may say: which accepts' secrets it took, and from whom (never a value),
	// and the last seq handled of each firehose it follows (CursorsFile), so that a restart
	// resumes each from there. Empty keeps that in memory only: a restart replays each
	// firehose from its start.
	StateDir string
	Log      *slog.Logger
	// Clock is what the bidder reads time and waits on (nil: the real clock): a bid's hold,
	// the wait for secrets and for a booted guest to run, the offering's createdAt.
	Clock clock.WithDelayedExecution
}

// Bidder is one running bidder.
type Bidder struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	bids     map[string]atrepo.StrongRef // rfp uri -> our bid
	receipts map[string]atrepo.StrongRef // accept uri -> our receipt
	ended    map[string]bool             // receipt uri -> our final event written
	active   map[string]bool             // receipt uri -> guest held
	// pending are bids not yet accepted (bid uri -> when), each holding a place for
	// BidHold so that a burst of rfps is not bid on beyond capacity. The requester's
	// accept of any bid on the rfp frees it at once.
	pending map[string]time.Time
	// accepted are the rfps whose requester's accept was seen (rfp uri -> accept uri): no
	// bid on them can win. An rfp comes before its accept in its firehose, so an entry is
	// needed only until the rfp is decided: the end of a replay, or a slower firehose
	// carrying the rfp again. Entries go after BidHold (acceptedAt: when each was seen).
	accepted   map[string]string
	acceptedAt map[string]time.Time
	// awaiting are accepted contracts whose guest waits for its secrets (accept uri ->).
	awaiting  map[string]*awaiting
	delivered map[string]deliveredTo // accept uri -> delivered secrets
	verifier  *serviceauth.Verifier
	endpoint  string
	// router reads any party's records: through the source whose firehose carried the DID's
	// events, else Fetch, else each source in turn.
	router *feed.Router
	// handleMu makes the events of every source one sequence, as they are of one source.
	handleMu sync.Mutex
	// cursors are the firehoses' last seqs handled (nil without a StateDir).
	cursors *feed.Cursors
	// recovered is closed once Run rebuilt its state: deliverSecrets waits for it, so a call
	// in a restart's first moments is not refused for an accept not yet known again.
	recovered chan struct{}
	wg        sync.WaitGroup
}

// New returns a bidder; Run starts it.
func New(cfg Config) *Bidder {
	if cfg.Capacity == 0 {
		cfg.Capacity = 8
	}
	if cfg.MaxGuestCPUs == 0 {
		cfg.MaxGuestCPUs = runtime.NumCPU()
	}
	if cfg.MaxGuestMemMiB == 0 {
		cfg.MaxGuestMemMiB = hostMemMiB()
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 60 * time.Second
	}
	if cfg.FetchTimeout == 0 {
		cfg.FetchTimeout = 30 * time.Second
	}
	if cfg.Currency == "" {
		cfg.Currency = "USD"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	fetchers := []feed.Fetcher{cfg.Fetch}
	for _, s := range cfg.Sources {
		fetchers = append(fetchers, s.Fetch)
	}
	router := feed.NewRouter(fetchers...)
	cfg.Fetch = router.Fetcher()
	return &Bidder{router: router, cfg: cfg, log: cfg.Log.With("bidder", cfg.Repo.DID()),
		bids: map[string]atrepo.StrongRef{}, receipts: map[string]atrepo.StrongRef{},
		ended: map[string]bool{}, active: map[string]bool{}, pending: map[string]time.Time{}, accepted: map[string]string{}, acceptedAt: map[string]time.Time{}, awaiting: map[string]*awaiting{}, delivered: map[string]deliveredTo{},
		recovered: make(chan struct{})}
}

// EndpointURL is the URL published in the offering once Run wrote it ("" before).
func (b *Bidder) EndpointURL() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.endpoint
}

// DID is the bidder's DID.
func (b *Bidder) DID() string { return b.cfg.Repo.DID() }

// GuestID is the substrate id of the guest booted for an accept.
func GuestID(acceptURI string) string {
	h := sha256.Sum256([]byte(acceptURI))
	return "g" + hex.EncodeToString(h[:8])
}

// CursorsFile is the state dir's file of the firehoses' cursors (feed.Cursors).
const CursorsFile = "cursors.json"

// Run writes the offering, recovers its state from its repo and the substrate, and follows
// the firehose until ctx ends. Guests keep running after it returns (Stop ends them).
func (b *Bidder) Run(ctx context.Context) error {
	endpoint := b.cfg.Repo.Endpoint()
	if err := b.loadDelivered(); err != nil {
		return err
	}
	if b.cfg.StateDir != "" {
		c, err := feed.OpenCursors(filepath.Join(b.cfg.StateDir, CursorsFile))
		if err != nil {
			return err
		}
		b.cursors = c
	}
	if b.cfg.Directory != nil {
		b.verifier = serviceauth.New(serviceauth.Config{Directory: serviceauth.CachingDirectory(b.cfg.Directory), Audiences: []string{b.DID()}})
		u, err := b.serveSecrets(ctx)
		if err != nil {
			return err
		}
		endpoint = u
	}
	off := mk.Offering{AppliesTo: []string{mk.ComputeVMNSID}, Substrates: []string{b.cfg.Substrate.Kind()}, CreatedAt: b.now(), EndpointURL: endpoint,
		Isolation:     []mk.OfferingIsolation{isolationEntry(b.cfg.Substrate.Kind(), b.cfg.Substrate.Isolation())},
		Architectures: []string{substrate.ArchOf(b.cfg.Substrate)}}
	if err := b.put(ctx, mk.OfferingNSID, "self", off); err != nil {
		return fmt.Errorf("offering: %w", err)
	}
	b.mu.Lock()
	b.endpoint = endpoint
	b.mu.Unlock()
	if err := b.recover(ctx); err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	close(b.recovered)
	flushed := make(chan struct{})
	go func() {
		defer close(flushed)
		b.cursors.Run(ctx, func(err error) { b.log.Warn("saving firehose cursors", "err", err) })
	}()
	for _, src := range b.cfg.Sources {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			b.follow(ctx, src.CursorKey(), src.Events, func(ev repos.Event) {
				if ev.DID != "" && ev.DID != b.DID() {
					b.router.Learn(ev.DID, src.Fetch)
				}
			})
		}()
	}
	b.follow(ctx, b.ownCursorKey(), b.cfg.Repo.Events(), nil)
	b.wg.Wait()
	<-flushed
	// Once more with every follower stopped: the last seqs they handled are kept.
	if err := b.cursors.Flush(); err != nil {
		b.log.Warn("saving firehose cursors", "err", err)
	}
	return ctx.Err()
}

// How long a firehose's replay must pause, or may last at most, before the rfps it carried
// are decided on.
const (
	replayQuiet = 250 * time.Millisecond
	replayMax   = 10 * time.Second
)

// replay is one firehose's backfill: the events committed before the bidder started. Its
// rfps wait in queued until it is over, because the requester's accept of an rfp comes
// after the rfp in the stream: decided as they come, a bidder starting late would bid on
// every rfp accepted in the last window. It is over once the event that was the newest when
// the bidder started is handled, where the firehose can say which (the embedded PDS's:
// repos.HeadSource); else at the first event committed after the start, once the stream was
// silent for replayQuiet after an event of the backfill, or after replayMax. Silent means no
// event arriving: the time an event takes to handle (reads, the other firehoses' turns) does
// not count, nor the connection's.
type replay struct {
	start  time.Time
	live   atomic.Bool
	queued []string // rfp uris in stream order; under handleMu
}

// ownCursorKey is the cursor key of the firehose of the bidder's own repo's PDS: the PDS of
// this process has one key whatever its port (feed.Source.CursorKey), another its URL's.
func (b *Bidder) ownCursorKey() string {
	if repos.IsLocal(b.cfg.Repo) {
		return feed.LocalCursorKey
	}
	return feed.CursorKey(b.cfg.Repo.Endpoint())
}

// follow handles the events of src (its cursor saved under key) from the one after its saved
// cursor (none: its first), each after before (nil: none). An event's seq is saved once it
// is decided on: live, not an rfp still held for the end of the backfill.
func (b *Bidder) follow(ctx context.Context, key string, src repos.EventSource, before func(repos.Event)) {
	r := &replay{start: time.Now()}
	most := time.AfterFunc(replayMax, func() { b.goLive(ctx, r) })
	defer most.Stop()
	cursor := b.cursors.Get(key)
	if cursor > 0 {
		b.log.Info("following from a saved cursor", "source", key, "cursor", cursor)
	}
	head, exact := feed.HeadOf(ctx, src)
	if exact && (head == 0 || head == cursor) {
		b.goLive(ctx, r) // nothing to replay (a cursor past head is refused and dropped for 0)
	}
	var quiet *time.Timer // armed after each event of the backfill
	held := false         // an event failed: the cursor saves nothing past it
	defer func() {
		if quiet != nil {
			quiet.Stop()
		}
	}()
	feed.Follow(ctx, src, cursor, func(ev repos.Event) {
		if quiet != nil {
			quiet.Stop()
		}
		if before != nil {
			before(ev)
		}
		// An event without a time (identity and account events carry none here) says
		// nothing of where the stream is: it counts as the backfill's.
		backfill := !r.live.Load() && !ev.Time.After(r.start)
		if !backfill {
			b.goLive(ctx, r)
		}
		// The cursor stays before the first event whose handling failed (a record not read, a
		// receipt not written): a restart replays from there, as one without a saved cursor
		// replays everything (the handlers are idempotent), and retries it.
		if b.handleFrom(ctx, ev, r) && !held {
			held = true
			b.log.Warn("firehose cursor held: an event was not handled; a restart handles it again", "source", key, "seq", ev.Seq)
		}
		if !held {
			b.saveCursor(key, ev.Seq, r)
		}
		switch {
		case exact && ev.Seq >= head:
			b.goLive(ctx, r)
		case exact:
		case backfill && !r.live.Load():
			if quiet == nil {
				quiet = time.AfterFunc(replayQuiet, func() { b.goLive(ctx, r) })
			} else {
				quiet.Reset(replayQuiet)
			}
		}
	})
}

// saveCursor records seq as handled of the source whose cursor key is key, once r is live:
// goLive decides the rfps it held under handleMu, so live seen under it means they are
// decided.
func (b *Bidder) saveCursor(key string, seq int64, r *replay) {
	if b.cursors == nil {
		return
	}
	b.handleMu.Lock()
	defer b.handleMu.Unlock()
	if r.live.Load() {
		b.cursors.Set(key, seq)
	}
}

// goLive ends r's backfill: the rfps it held are decided on, with every accept it carried
// known.
func (b *Bidder) goLive(ctx context.Context, r *replay) {
	if r.live.Load() {
		return
	}
	b.handleMu.Lock()
	defer b.handleMu.Unlock()
	if r.live.Swap(true) || ctx.Err() != nil {
		return
	}
	queued := r.queued
	r.queued = nil
	for _, uri := range queued {
		if err := b.onRFP(ctx, uri); err != nil {
			b.log.Warn("rfp", "uri", uri, "err", err)
		}
	}
}

func (b *Bidder) now() string { return b.cfg.Clock.Now().UTC().Format(time.RFC3339Nano) }

func (b *Bidder) put(ctx context.Context, coll, rkey string, v any) error {
	_, err := b.putRef(ctx, coll, rkey, v)
	return err
}

func (b *Bidder) putRef(ctx context.Context, coll, rkey string, v any) (atrepo.StrongRef, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return atrepo.StrongRef{}, err
	}
	w, err := b.cfg.Repo.Put(ctx, coll, rkey, raw, nil)
	if err != nil {
		return atrepo.StrongRef{}, err
	}
	return atrepo.StrongRef{URI: w.URI, CID: w.CID}, nil
}

func (b *Bidder) list(ctx context.Context, coll string, fn func(repos.Record)) error {
	cursor := ""
	for {
		recs, next, err := b.cfg.Repo.List(ctx, coll, cursor, 100)
		if err != nil {
			return err
		}
		for _, r := range recs {
			fn(r)
		}
		if next == "" || len(recs) == 0 {
			return nil
		}
		cursor = next
	}
}

// recover rebuilds what it bid, what it holds and what it ended from its own repo, then
// reconciles the substrate's guests with that: a guest whose contract ended is stopped; a
// held guest is watched again; a held guest that is gone is reported ended.
func (b *Bidder) recover(ctx context.Context) error {
	if err := b.list(ctx, mk.BidNSID, func(r repos.Record) {
		var bid mk.Bid
		if json.Unmarshal(r.Value, &bid) == nil {
			b.bids[bid.RFP.URI] = atrepo.StrongRef{URI: r.URI, CID: r.CID}
		}
	}); err != nil {
		return err
	}
	if err := b.list(ctx, mk.ReceiptNSID, func(r repos.Record) {
		var rc mk.Receipt
		if json.Unmarshal(r.Value, &rc) == nil {
			b.receipts[rc.Accept.URI] = atrepo.StrongRef{URI: r.URI, CID: r.CID}
		}
	}); err != nil {
		return err
	}
	if err := b.list(ctx, mk.EventNSID, func(r repos.Record) {
		var ev mk.Event
		if json.Unmarshal(r.Value, &ev) == nil && ev.Payload.ComputeEventsVMDelete != nil {
			b.ended[ev.Receipt.URI] = true
		}
	}); err != nil {
		return err
	}
	guests, err := b.cfg.Substrate.List(ctx)
	if err != nil {
		return err
	}
	byID := map[string]substrate.GuestStatus{}
	for _, g := range guests {
		byID[g.ID] = g
	}
	resume, err := b.recoverStarts(ctx, byID)
	if err != nil {
		return err
	}
	for acceptURI, rc := range b.receipts {
		id := GuestID(acceptURI)
		g, ok := byID[id]
		delete(byID, id)
		switch {
		case b.ended[rc.URI]:
			if ok && !g.Phase.Ended() {
				b.stop(ctx, id)
			}
			b.dropIntent(id) // of a start that raced the contract's end
		case ok && !g.Phase.Ended() && resume[acceptURI]:
			// A start cut short after its boot: reported once the guest runs.
			b.active[rc.URI] = true
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				b.started(ctx, acceptURI, id, rc)
			}()
		case ok && !g.Phase.Ended():
			b.active[rc.URI] = true
			b.watchEnd(ctx, id, rc)
		case !ok && b.awaitAgain(ctx, acceptURI, rc):
			// Accepted and still waiting for its secrets when the bidder stopped.
		default:
			b.finish(ctx, id, rc, "guest gone while the bidder was down")
		}
	}
	b.mu.Lock()
	for acc := range b.delivered { // contracts that ended while the bidder was down
		if rc, ok := b.receipts[acc]; !ok || b.ended[rc.URI] {
			delete(b.delivered, acc)
		}
	}
	err = b.saveDelivered()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	for id, g := range byID { // guests with no receipt: a boot that never got its receipt written
		if !g.Phase.Ended() {
			b.stop(ctx, id)
		}
	}
	return nil
}

// handle handles a live event.
func (b *Bidder) handle(ctx context.Context, ev repos.Event) { b.handleFrom(ctx, ev, nil) }

// handleFrom handles an event of r's firehose (nil: live), holding an rfp until r's backfill
// is over. failed says a record of it could not be handled (logged): a restart is to see it
// again.
func (b *Bidder) handleFrom(ctx context.Context, ev repos.Event, r *replay) (failed bool) {
	b.handleMu.Lock()
	defer b.handleMu.Unlock()
	for _, op := range ev.Ops {
		if op.Action == "delete" {
			continue
		}
		uri := feed.URI(ev.DID, op.Collection, op.RKey)
		switch op.Collection {
		case mk.RFPNSID:
			if r != nil && !r.live.Load() {
				r.queued = append(r.queued, uri)
				continue
			}
			if err := b.onRFP(ctx, uri); err != nil {
				b.log.Warn("rfp", "uri", uri, "err", err)
				failed = true
			}
		case mk.AcceptNSID:
			if err := b.onAccept(ctx, uri); err != nil {
				b.log.Warn("accept", "uri", uri, "err", err)
				failed = true
			}
		case mk.EventNSID:
			if ev.DID == b.DID() {
				continue
			}
			if err := b.onEvent(ctx, uri); err != nil {
				b.log.Warn("event", "uri", uri, "err", err)
				failed = true
			}
		}
	}
	return failed
}

// evaluate says whether the bidder bids on rfp: its payload kind, its policy, capacity.
func (b *Bidder) evaluate(ctx context.Context, rfp *mk.RFP) (*mk.ComputeVM, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	bound := b.cfg.Clock.AfterFunc(b.cfg.FetchTimeout, func() {
		cancel(fmt.Errorf("the requester's records were not read within %s", b.cfg.FetchTimeout))
	})
	defer bound.Stop()
	prec, err := b.cfg.Fetch.Get(ctx, rfp.Payload.URI)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			err = cause
		}
		return nil, fmt.Errorf("payload: %w", err)
	}
	vm, err := mk.DecodeComputeVM(prec.Value)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	kind := mk.ComputeVMComputeKindVM
	if vm.ComputeKind != nil {
		kind = *vm.ComputeKind
	}
	if kind != b.cfg.Substrate.Kind() {
		return nil, fmt.Errorf("computeKind %s not served (%s)", kind, b.cfg.Substrate.Kind())
	}
	if len(vm.Secrets) > 0 && b.cfg.Directory == nil {
		return nil, fmt.Errorf("the payload names %d secret(s) and this bidder serves no deliverSecrets endpoint", len(vm.Secrets))
	}
	for _, n := range vm.Secrets {
		if !substrate.ValidSecretName(n) {
			return nil, fmt.Errorf("secret name %q cannot name a file in the guest", n)
		}
	}
	if err := readPolicy(ctx, b.cfg.Fetch, rfp.Policy.URI).Allows(market.Candidate{Bidder: b.DID(), CPUs: vm.Cpus}); err != nil {
		return nil, err
	}
	if err := b.fitsGuest(vm); err != nil {
		return nil, err
	}
	if n := b.load(); n >= b.cfg.Capacity {
		return nil, fmt.Errorf("at capacity (%d guests and open bids of %d)", n, b.cfg.Capacity)
	}
	return vm, nil
}

// fitsGuest says whether the guest vm asks for is one this bidder runs whole.
func (b *Bidder) fitsGuest(vm *mk.ComputeVM) error {
	if vm.Cpus > int64(b.cfg.MaxGuestCPUs) {
		return fmt.Errorf("asks for %d CPUs; this bidder runs guests of at most %d", vm.Cpus, b.cfg.MaxGuestCPUs)
	}
	if b.cfg.MaxGuestMemMiB > 0 && vm.Mem > int64(b.cfg.MaxGuestMemMiB) {
		return fmt.Errorf("asks for %d MiB of memory; this bidder runs guests of at most %d MiB", vm.Mem, b.cfg.MaxGuestMemMiB)
	}
	return nil
}

// hostMemMiB is the host's memory in MiB; 0 when it cannot be read (memory then bounds no
// bid).
func hostMemMiB() int {
	c, err := hostcap.Read()
	if err != nil {
		return 0
	}
	return int(c.MemMiB())
}

// BidHold is how long an unanswered bid holds a place of the bidder's capacity.
const BidHold = 2 * time.Minute

// load is the guests held plus the bids still holding a place.
func (b *Bidder) load() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := len(b.active)
	for uri, at := range b.pending {
		if b.cfg.Clock.Since(at) > BidHold {
			delete(b.pending, uri)
			continue
		}
		n++
	}
	return n
}

// readPolicy reads an rfp's policy record; any failure is a Policy that denies.
func readPolicy(ctx context.Context, f feed.Fetcher, uri string) market.Policy {
	u, err := infra.ParseATURI(uri)
	if err != nil {
		return market.Policy{Err: err}
	}
	rec, err := f.Get(ctx, uri)
	if err != nil {
		return market.Policy{Err: err}
	}
	p := market.Policy{NSID: u.Collection.String()}
	switch p.NSID {
	case mk.PoliciesOnlyMeNSID:
		v, err := mk.DecodePoliciesOnlyMe(rec.Value)
		if err != nil {
			return market.Policy{Err: err}
		}
		p.RequesterDID = v.RequesterDID
	case mk.PoliciesOpenNSID:
		if _, err := mk.DecodePoliciesOpen(rec.Value); err != nil {
			return market.Policy{Err: err}
		}
	}
	return p
}

// fetchUnhandled reads the record at uri for a handler, unless handled (called under b.mu)
// says it was dealt with already. It returns nil, nil then, and for a record that is gone.
func (b *Bidder) fetchUnhandled(ctx context.Context, uri string, handled func() bool) (*repos.Record, error) {
	b.mu.Lock()
	done := handled()
	b.mu.Unlock()
	if done {
		return nil, nil
	}
	rec, err := b.cfg.Fetch.Get(ctx, uri)
	if errors.Is(err, repos.ErrNotFound) {
		return nil, nil
	}
	return rec, err
}

func (b *Bidder) onRFP(ctx context.Context, uri string) error {
	rec, err := b.fetchUnhandled(ctx, uri, func() bool { _, ok := b.bids[uri]; return ok })
	if rec == nil || err != nil {
		return err
	}
	rfp, err := mk.DecodeRFP(rec.Value)
	if err != nil {
		return err
	}
	b.mu.Lock()
	choice := market.BidOn(market.RFPSeen{URI: uri, CreatedAt: rfp.CreatedAt, WindowMs: rfp.BidWindowMs}, b.accepted, b.cfg.Clock.Now())
	b.mu.Unlock()
	if !choice.Bids() {
		b.log.Info("market_no_bid", "rfp", uri, "skip", string(choice.Skip), "reason", choice.Reason)
		return nil
	}
	vm, err := b.evaluate(ctx, rfp)
	if err != nil {
		b.log.Info("market_no_bid", "rfp", uri, "reason", err.Error())
		return nil
	}
	size := market.Size{CPUs: vm.Cpus, MemMiB: vm.Mem}
	pay, err := b.payload(size)
	if err != nil {
		b.log.Info("market_no_bid", "rfp", uri, "reason", err.Error())
		return nil
	}
	crashpoint.Hit(crashpoint.BidderBeforeBid)
	// The bid states the size it prices, so that a requester can tell it from a bid for less.
	bid := mk.Bid{RFP: atrepo.StrongRef{URI: uri, CID: rec.CID}, Payload: pay, Size: &mk.BidSize{Cpus: size.CPUs, MemMiB: size.MemMiB}}
	ref, err := b.putRef(ctx, mk.BidNSID, feed.TID(), bid)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.bids[uri] = ref
	b.pending[ref.URI] = b.cfg.Clock.Now()
	b.mu.Unlock()
	b.log.Info("market_bid", "rfp", uri, "bid", ref.URI)
	return nil
}

// payload is the bid's payload for a guest of size: free, or priced by size. A price that
// cannot be computed (a size too large for the cost to hold) is a reason not to bid.
func (b *Bidder) payload(size market.Size) (mk.BidPayload, error) {
	if b.cfg.Free {
		return mk.BidPayload{BidsFree: &mk.BidsFree{}}, nil
	}
	cost, err := b.pricing().Price(size)
	if err != nil {
		return mk.BidPayload{}, fmt.Errorf("price of %s: %w", size, err)
	}
	return mk.BidPayload{BidsPriced: &mk.BidsPriced{Cost: cost, Currency: b.cfg.Currency, Frequency: mk.BidsPricedFrequencyHour}}, nil
}

// pricing is the bidder's price by size.
func (b *Bidder) pricing() market.Pricing {
	return market.Pricing{Base: b.cfg.Cost, PerCPU: b.cfg.CostPerCPU, PerGiB: b.cfg.CostPerGiB}
}

func (b *Bidder) onAccept(ctx context.Context, uri string) error {
	rec, err := b.fetchUnhandled(ctx, uri, func() bool { _, ok := b.receipts[uri]; return ok })
	if rec == nil || err != nil {
		return err
	}
	acc, err := mk.DecodeAccept(rec.Value)
	if err != nil {
		return err
	}
	// Only the rfp's requester chooses among its bids: an accept by anyone else, or of our bid
	// naming another rfp than the one it answered, is not an answer to it.
	byRequester := sameAuthor(uri, acc.RFP.URI)
	b.mu.Lock()
	bid, bidOn := b.bids[acc.RFP.URI]
	ours := bidOn && byRequester && bid.URI == acc.Bid.URI
	if byRequester {
		b.noteAccept(acc.RFP.URI, uri)
	}
	if bidOn && byRequester {
		delete(b.pending, bid.URI) // its place becomes the guest's, or is freed when another bid won
	}
	b.mu.Unlock()
	if !ours {
		return nil
	}
	rfpRec, err := b.cfg.Fetch.Get(ctx, acc.RFP.URI)
	if err != nil {
		return err
	}
	rfp, err := mk.DecodeRFP(rfpRec.Value)
	if err != nil {
		return err
	}
	vm, err := b.evaluate(ctx, rfp)
	if err != nil {
		b.log.Warn("market_accept_declined", "accept", uri, "reason", err.Error())
		return nil
	}
	spec := guestSpec(uri, vm)
	receipt := mk.Receipt{Accept: atrepo.StrongRef{URI: uri, CID: rec.CID}, Bid: acc.Bid, CID: rec.CID, RFP: acc.RFP}
	if len(vm.Secrets) > 0 {
		return b.acceptWithSecrets(ctx, uri, spec, receipt, vm.Secrets)
	}
	id := spec.ID
	// The intent first: a crash from here on leaves a file saying what was under way.
	in := startIntent{Accept: uri, Guest: id, Phase: phaseBeforeBoot, ReceiptKey: feed.TID(), Receipt: receipt}
	if err := b.writeIntent(in); err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.BidderAfterIntent)
	_, bootErr := b.cfg.Substrate.Boot(ctx, spec)
	if errors.Is(bootErr, substrate.ErrExists) {
		bootErr = b.bootOver(ctx, spec)
	}
	crashpoint.Hit(crashpoint.BidderAfterBoot)
	if bootErr == nil {
		b.advanceIntent(&in, phaseBooted)
	}
	rc, err := b.writeReceipt(ctx, in)
	if err != nil {
		b.stop(ctx, id)
		b.dropIntent(id)
		return errors.Join(bootErr, fmt.Errorf("receipt: %w", err))
	}
	crashpoint.Hit(crashpoint.BidderAfterReceipt)
	b.advanceIntent(&in, phaseReceiptWritten)
	b.mu.Lock()
	b.receipts[uri], b.active[rc.URI] = rc, true
	b.mu.Unlock()
	if bootErr != nil {
		// The requester hears why, as after a boot with secrets: the receipt, then the final
		// event with the reason, rather than silence until its answer wait gives up.
		b.finish(ctx, id, rc, fmt.Sprintf("boot: %v", bootErr))
		return nil
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		b.started(ctx, uri, id, rc)
	}()
	return nil
}

// noteAccept remembers the requester's accept of rfp for BidOn and forgets those seen more
// than BidHold ago (called under b.mu).
func (b *Bidder) noteAccept(rfp, accept string) {
	now := b.cfg.Clock.Now()
	for r, at := range b.acceptedAt {
		if now.Sub(at) > BidHold {
			delete(b.accepted, r)
			delete(b.acceptedAt, r)
		}
	}
	b.accepted[rfp], b.acceptedAt[rfp] = accept, now
}

// payloadOf reads the compute.vm payload of an accept's rfp.
func (b *Bidder) payloadOf(ctx context.Context, acceptURI string) (*mk.ComputeVM, error) {
	rec, err := b.cfg.Fetch.Get(ctx, acceptURI)
	if err != nil {
		return nil, err
	}
	acc, err := mk.DecodeAccept(rec.Value)
	if err != nil {
		return nil, err
	}
	rfpRec, err := b.cfg.Fetch.Get(ctx, acc.RFP.URI)
	if err != nil {
		return nil, err
	}
	rfp, err := mk.DecodeRFP(rfpRec.Value)
	if err != nil {
		return nil, err
	}
	prec, err := b.cfg.Fetch.Get(ctx, rfp.Payload.URI)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	return mk.DecodeComputeVM(prec.Value)
}

// guestSpec is the guest an accept's payload asks for (without its secrets).
func guestSpec(acceptURI string, vm *mk.ComputeVM) substrate.GuestSpec {
	spec := substrate.GuestSpec{ID: GuestID(acceptURI), CPUs: int(vm.Cpus), MemMiB: int(vm.Mem)}
	if vm.Disk != nil && *vm.Disk > 0 && *vm.Disk <= math.MaxInt32 {
		spec.DiskMiB = int(*vm.Disk)
	}
	if vm.UserData != nil {
		spec.UserData = []byte(*vm.UserData)
	}
	for _, p := range vm.Ports {
		spec.Ports = append(spec.Ports, substrate.Port{Name: p.Name, Guest: int(p.Port)})
	}
	return spec
}

// onNetwork is the vm.onNetwork event of a running guest: its address and where each of its
// ports is forwarded.
func onNetwork(gs substrate.GuestStatus) *mk.ComputeEventsVMOnNetwork {
	n := &mk.ComputeEventsVMOnNetwork{Address: gs.Address}
	for _, p := range gs.Ports {
		n.Ports = append(n.Ports, mk.ComputeEventsVMOnNetworkPortBinding{Name: p.Name, Guest: int64(p.Guest), Host: int64(p.Host)})
	}
	return n
}

// acceptWithSecrets answers an accept whose payload names secrets: the receipt first (the
// requester delivers once it binds), then, once deliverSecrets handed the values over, the
// guest boots with them. No secret by ReadyTimeout ends the contract.
func (b *Bidder) acceptWithSecrets(ctx context.Context, uri string, spec substrate.GuestSpec, receipt mk.Receipt, names []string) error {
	a, err := b.newAwaiting(uri, names)
	if err != nil {
		return err
	}
	rc, err := b.putRef(ctx, mk.ReceiptNSID, feed.TID(), receipt)
	if err != nil {
		b.forget(uri, a)
		return fmt.Errorf("receipt: %w", err)
	}
	b.mu.Lock()
	b.receipts[uri], b.active[rc.URI] = rc, true
	b.mu.Unlock()
	b.awaitSecrets(ctx, uri, spec, rc, a)
	return nil
}

// awaitAgain is recover's for a receipt without a guest: if its payload names secrets that
// were never delivered, the bidder was stopped while it waited for them, and it waits again
// (for a fresh ReadyTimeout). It says whether it does.
func (b *Bidder) awaitAgain(ctx context.Context, uri string, rc atrepo.StrongRef) bool {
	b.mu.Lock()
	_, took := b.delivered[uri]
	b.mu.Unlock()
	if took || b.cfg.Directory == nil {
		return false // taken and the guest is gone: the values are not kept, the contract ends
	}
	vm, err := b.payloadOf(ctx, uri)
	if err != nil {
		b.log.Warn("recover", "accept", uri, "err", err)
		return false
	}
	if len(vm.Secrets) == 0 {
		return false
	}
	a, err := b.newAwaiting(uri, vm.Secrets)
	if err != nil {
		return false
	}
	b.mu.Lock()
	b.active[rc.URI] = true
	b.mu.Unlock()
	b.log.Info("market_secrets_awaited_again", "accept", uri)
	b.awaitSecrets(ctx, uri, guestSpec(uri, vm), rc, a)
	return true
}

func (b *Bidder) newAwaiting(uri string, names []string) (*awaiting, error) {
	u, err := infra.ParseATURI(uri)
	if err != nil {
		return nil, err
	}
	requester := u.DID.String()
	sorted := slices.Clone(names)
	sort.Strings(sorted)
	a := &awaiting{requester: requester, names: sorted, got: make(chan map[string][]byte, 1), stop: make(chan struct{})}
	b.mu.Lock()
	b.awaiting[uri] = a
	b.mu.Unlock()
	return a, nil
}

func (b *Bidder) forget(uri string, a *awaiting) {
	b.mu.Lock()
	if b.awaiting[uri] == a {
		delete(b.awaiting, uri)
	}
	b.mu.Unlock()
}

// awaitSecrets waits for a's secrets, then boots the guest with them and reports it.
func (b *Bidder) awaitSecrets(ctx context.Context, uri string, spec substrate.GuestSpec, rc atrepo.StrongRef, a *awaiting) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer b.forget(uri, a)
		t := b.cfg.Clock.NewTimer(b.cfg.ReadyTimeout)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-a.stop:
			return
		case <-t.C():
			b.finish(ctx, spec.ID, rc, fmt.Sprintf("the requester delivered no secrets within %s", b.cfg.ReadyTimeout))
			return
		case vals := <-a.got:
			b.mu.Lock()
			ended := b.ended[rc.URI]
			b.mu.Unlock()
			if ended {
				return
			}
			spec.Secrets = vals
		}
		// The receipt is written already; the intent says a boot with secrets is under way.
		in := startIntent{Accept: uri, Guest: spec.ID, Phase: phaseBeforeBoot, ReceiptKey: rkeyOf(rc.URI), Secrets: true}
		if err := b.writeIntent(in); err != nil {
			b.finish(ctx, spec.ID, rc, fmt.Sprintf("boot: %v", err))
			return
		}
		_, err := b.cfg.Substrate.Boot(ctx, spec)
		if errors.Is(err, substrate.ErrExists) {
			err = b.bootOver(ctx, spec)
		}
		if err != nil {
			b.finish(ctx, spec.ID, rc, fmt.Sprintf("boot: %v", err))
			return
		}
		b.advanceIntent(&in, phaseReceiptWritten)
		spec.Secrets = nil
		b.started(ctx, uri, spec.ID, rc)
	}()
}

// started waits for a booted guest to run, writes vm.started and vm.onNetwork, and watches
// for its end.
func (b *Bidder) started(ctx context.Context, uri, id string, rc atrepo.StrongRef) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := b.cfg.Clock.AfterFunc(b.cfg.ReadyTimeout, cancel)
	defer ready.Stop()
	gs, err := substrate.WaitRunning(wctx, b.cfg.Substrate, id)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		err = context.DeadlineExceeded // ReadyTimeout passed, as a context deadline says it
	}
	if err != nil || gs.Phase != substrate.Running {
		if ctx.Err() == nil {
			b.finish(ctx, id, rc, fmt.Sprintf("guest did not start: %v %s", err, gs.Message))
		}
		return
	}
	crashpoint.Hit(crashpoint.BidderBeforeStarted)
	if err := b.event(ctx, rc, mk.EventPayload{ComputeEventsVMStarted: &mk.ComputeEventsVMStarted{}}); err != nil {
		b.log.Warn("event", "err", err)
	}
	if err := b.event(ctx, rc, mk.EventPayload{ComputeEventsVMOnNetwork: onNetwork(gs)}); err != nil {
		b.log.Warn("event", "err", err)
	}
	// The start is reported; a crash before this line writes the two events again.
	b.dropIntent(id)
	b.log.Info("market_started", "accept", uri, "guest", id)
	b.watchEnd(ctx, id, rc)
}

// watchEnd reports a guest that ends by itself.
func (b *Bidder) watchEnd(ctx context.Context, id string, rc atrepo.StrongRef) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		gs, err := substrate.WaitEnded(ctx, b.cfg.Substrate, id)
		if err != nil || ctx.Err() != nil {
			return
		}
		// The guest's state goes with finish: keep the end of its log where the operator looks.
		if tail, err := b.cfg.Substrate.Logs(ctx, id, 20); err == nil && len(tail) > 0 {
			b.log.Warn("market_guest_ended", "guest", id, "phase", gs.Phase, "exit", gs.ExitCode, "log", string(tail))
		}
		b.finish(ctx, id, rc, fmt.Sprintf("guest ended by itself: %s (exit %d)", gs.Phase, gs.ExitCode))
	}()
}

func (b *Bidder) event(ctx context.Context, rc atrepo.StrongRef, p mk.EventPayload) error {
	return b.put(ctx, mk.EventNSID, feed.TID(), mk.Event{Receipt: rc, Payload: p})
}

func (b *Bidder) stop(ctx context.Context, id string) {
	if err := b.cfg.Substrate.Stop(ctx, id); err != nil && !errors.Is(err, substrate.ErrNotFound) {
		b.log.Warn("stop", "guest", id, "err", err)
	}
	if err := b.cfg.Substrate.Remove(ctx, id); err != nil && !errors.Is(err, substrate.ErrNotFound) {
		b.log.Warn("remove", "guest", id, "err", err)
	}
}

// bootOver is a boot that found a guest of spec's ID there already (ErrExists): one that
// runs or is starting is the guest (a boot answered twice), kept; one that ended, or whose
// state does not read (what a start cut short leaves), is stopped, removed and booted again.
// Taking any leftover for a booted guest reported a start that never happened.
func (b *Bidder) bootOver(ctx context.Context, spec substrate.GuestSpec) error {
	gs, err := b.cfg.Substrate.Status(ctx, spec.ID)
	if err == nil && !gs.Phase.Ended() {
		return nil
	}
	b.log.Info("market_guest_replaced", "guest", spec.ID, "phase", string(gs.Phase), "message", gs.Message)
	b.stop(ctx, spec.ID)
	_, err = b.cfg.Substrate.Boot(ctx, spec)
	return err
}

// finish stops the guest (if it runs) and writes the final vm.delete event once.
func (b *Bidder) finish(ctx context.Context, id string, rc atrepo.StrongRef, reason string) {
	b.mu.Lock()
	if b.ended[rc.URI] {
		b.mu.Unlock()
		return
	}
	b.ended[rc.URI] = true
	delete(b.active, rc.URI)
	for acc, r := range b.receipts {
		if a := b.awaiting[acc]; a != nil && r.URI == rc.URI { // ended before its secrets came
			if !a.stopped {
				a.stopped = true
				close(a.stop)
			}
			delete(b.awaiting, acc)
		}
		if _, took := b.delivered[acc]; took && r.URI == rc.URI {
			delete(b.delivered, acc)
			if err := b.saveDelivered(); err != nil {
				b.log.Warn("state", "err", err)
			}
		}
	}
	b.mu.Unlock()
	b.stop(ctx, id)
	if len(reason) > 256 {
		reason = reason[:256]
	}
	if err := b.event(ctx, rc, mk.EventPayload{ComputeEventsVMDelete: &mk.ComputeEventsVMDelete{Reason: &reason}}); err != nil {
		b.log.Warn("final event", "receipt", rc.URI, "err", err)
	}
	// Last, so that a crash before the final event finds the intent and the receipt again.
	b.dropIntent(id)
	b.log.Info("market_released", "receipt", rc.URI, "guest", id, "reason", reason)
}

func (b *Bidder) onEvent(ctx context.Context, uri string) error {
	rec, err := b.fetchUnhandled(ctx, uri, func() bool { return false })
	if rec == nil || err != nil {
		return err
	}
	ev, err := mk.DecodeEvent(rec.Value)
	if err != nil || ev.Payload.ComputeEventsVMDelete == nil {
		return err
	}
	b.mu.Lock()
	var acceptURI string
	var rc atrepo.StrongRef
	for a, r := range b.receipts {
		if r.URI == ev.Receipt.URI {
			acceptURI, rc = a, r
		}
	}
	b.mu.Unlock()
	if acceptURI == "" {
		return nil
	}
	// Only the requester (the accept's author) may release.
	if !sameAuthor(acceptURI, uri) {
		return nil
	}
	b.finish(ctx, GuestID(acceptURI), rc, "released on request")
	return nil
}

// StopAll stops every guest of the substrate (for a bidder that is shutting its host down).
func (b *Bidder) StopAll(ctx context.Context) {
	gs, _ := b.cfg.Substrate.List(ctx)
	for _, g := range gs {
		b.stop(ctx, g.ID)
	}
}

// isolationEntry is the offering's statement of what the substrate of kind applies to its
// guests, as the substrate itself reports it.
func isolationEntry(kind string, iso substrate.Isolation) mk.OfferingIsolation {
	return mk.OfferingIsolation{Substrate: kind, Boundary: iso.Boundary, Layers: append([]string(nil), iso.Layers...)}
}

// sameAuthor reports whether two records' at-uris name the same repo; an at-uri that does
// not parse has no author, so it is never the same as another's.
func sameAuthor(a, b string) bool {
	ua, err := infra.ParseATURI(a)
	if err != nil {
		return false
	}
	ub, err := infra.ParseATURI(b)
	return err == nil && ua.DID == ub.DID
}
