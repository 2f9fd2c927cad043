package bidder

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
)

// These tests run the bidder's handlers against a real in-process PDS (its repo, the
// requester's and another bidder's) and a substrate of the test's own, which keeps guests in
// memory and is told what to do (fail a boot, stay Booting, end a guest). Events are handed
// to the bidder one at a time in the order a firehose would carry them, so that "no bid" is
// a fact after the handler returns rather than the absence of one within a wait.

// fakeSubstrate is a substrate of guests in memory.
type fakeSubstrate struct {
	mu     sync.Mutex
	guests map[string]substrate.GuestStatus
	boots  int
	stops  map[string]int
	// bootErr fails every Boot; bootPhase is the phase a booted guest reports (zero: Running).
	bootErr   error
	bootPhase substrate.Phase
	// onBoot, when set, is called at each Boot before the guest exists.
	onBoot func(spec substrate.GuestSpec)
}

func newFakeSubstrate() *fakeSubstrate {
	return &fakeSubstrate{guests: map[string]substrate.GuestStatus{}, stops: map[string]int{}}
}

const fakeKind = mk.ComputeVMComputeKindVM

func (f *fakeSubstrate) Kind() string { return fakeKind }

func (f *fakeSubstrate) Isolation() substrate.Isolation {
	return substrate.Isolation{Boundary: substrate.BoundaryProcess}
}

func (f *fakeSubstrate) Boot(_ context.Context, spec substrate.GuestSpec) (substrate.GuestStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boots++
	if f.onBoot != nil {
		f.onBoot(spec)
	}
	if f.bootErr != nil {
		return substrate.GuestStatus{}, f.bootErr
	}
	if _, ok := f.guests[spec.ID]; ok {
		return substrate.GuestStatus{}, substrate.Errorf(fakeKind, "boot", spec.ID, substrate.ErrExists, "")
	}
	phase := f.bootPhase
	if phase == "" {
		phase = substrate.Running
	}
	g := substrate.GuestStatus{ID: spec.ID, Kind: fakeKind, Phase: phase, Address: "127.0.0.1"}
	f.guests[spec.ID] = g
	return g, nil
}

func (f *fakeSubstrate) Status(_ context.Context, id string) (substrate.GuestStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.guests[id]
	if !ok {
		return substrate.GuestStatus{}, substrate.Errorf(fakeKind, "status", id, substrate.ErrNotFound, "")
	}
	return g, nil
}

func (f *fakeSubstrate) Logs(context.Context, string, int) ([]byte, error) { return nil, nil }

func (f *fakeSubstrate) Stop(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.guests[id]
	if !ok {
		return substrate.Errorf(fakeKind, "stop", id, substrate.ErrNotFound, "")
	}
	f.stops[id]++
	if !g.Phase.Ended() {
		g.Phase = substrate.Stopped
		f.guests[id] = g
	}
	return nil
}

func (f *fakeSubstrate) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.guests[id]
	if !ok {
		return substrate.Errorf(fakeKind, "remove", id, substrate.ErrNotFound, "")
	}
	if !g.Phase.Ended() {
		return substrate.Errorf(fakeKind, "remove", id, substrate.ErrRunning, "")
	}
	delete(f.guests, id)
	return nil
}

func (f *fakeSubstrate) List(context.Context) ([]substrate.GuestStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]substrate.GuestStatus, 0, len(f.guests))
	for _, g := range f.guests {
		out = append(out, g)
	}
	return out, nil
}

// set puts a guest in a phase (adding it when absent), as if it had run or ended by itself.
func (f *fakeSubstrate) set(id string, phase substrate.Phase) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.guests[id] = substrate.GuestStatus{ID: id, Kind: fakeKind, Phase: phase, Address: "127.0.0.1"}
}

func (f *fakeSubstrate) drop(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.guests, id)
}

// phase is the guest's phase, "" when the substrate has no such guest.
func (f *fakeSubstrate) phase(id string) substrate.Phase {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.guests[id].Phase
}

func (f *fakeSubstrate) counts(id string) (boots, stops int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.boots, f.stops[id]
}

// quietRepo is a repo whose firehose carries nothing: the test hands the bidder its events.
type quietRepo struct{ repos.Repo }

func (quietRepo) Events() repos.EventSource { return quietSource{} }

type quietSource struct{}

// replayRepo is a repo whose firehose replays events (the backfill of a bidder that starts
// after they were committed), then carries nothing.
type replayRepo struct {
	repos.Repo
	events []repos.Event
	// connect is how long the firehose takes to carry its first event.
	connect time.Duration
}

func (r replayRepo) Events() repos.EventSource { return replaySource(r) }

type replaySource replayRepo

func (s replaySource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	time.Sleep(s.connect)
	for _, ev := range s.events {
		if cursor != nil && ev.Seq <= *cursor {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

// headedRepo is a replayRepo whose firehose says its newest seq, as the embedded PDS's does
// (repos.HeadSource), and falls silent for pause after the event of seq pauseAfter.
type headedRepo struct {
	replayRepo
	pauseAfter int64
	pause      time.Duration
}

func (r headedRepo) Events() repos.EventSource { return headedSource(r) }

type headedSource headedRepo

func (s headedSource) Head(context.Context) (int64, error) {
	return s.events[len(s.events)-1].Seq, nil
}

func (s headedSource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	for _, ev := range s.events {
		if cursor != nil && ev.Seq <= *cursor {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
		if ev.Seq == s.pauseAfter {
			time.Sleep(s.pause)
		}
	}
	<-ctx.Done()
	return ctx.Err()
}

func (quietSource) Subscribe(ctx context.Context, _ *int64, _ func(repos.Event) error) error {
	<-ctx.Done()
	return ctx.Err()
}

// env is the shared PDS with a fresh account of the bidder, the requester's payload and open
// policy, a substrate and a clock.
type env struct {
	t                      *testing.T
	srv                    *pds.Server
	repo, requester, rival repos.Repo
	payload, policy        atrepo.StrongRef
	sub                    *fakeSubstrate
	clock                  *clocktesting.FakeClock
	ctx                    context.Context
	// runs is the context each started bidder runs in: its handlers take it, as Run's do.
	runs map[*Bidder]context.Context
	// maxCPUs and maxMemMiB are the largest guest the bidders start runs (0: the host's).
	maxCPUs, maxMemMiB int
	// stateDir is every bidder's state dir (its start intents).
	stateDir string
	// price is the bidders' price (Config Cost, CostPerCPU, CostPerGiB, Free).
	price Config
	// log is the bidders' log (nil: discarded).
	log *slog.Logger
}

// shared is one PDS for the package's tests with the requester's and the rival's accounts:
// an account costs a bcrypt hash (a second or more under -race), so a test makes only its
// bidder's, whose repo is then its own.
var shared struct {
	srv              *pds.Server
	requester, rival repos.Repo
	bidders          atomic.Int64
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bidder-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		ctx := context.Background()
		srv, err := pds.New(pds.Config{DataDir: dir, Logger: quietLog()})
		if err == nil {
			err = srv.Start(ctx)
		}
		if err == nil {
			defer srv.Close()
			shared.srv = srv
			shared.requester, err = account(ctx, "requester.test")
		}
		if err == nil {
			shared.rival, err = account(ctx, "rival.test")
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// account creates an account on the shared PDS and returns its repo.
func account(ctx context.Context, handle string) (repos.Repo, error) {
	if _, err := shared.srv.CreateAccount(ctx, handle, "password-1234"); err != nil {
		return nil, err
	}
	return repos.Local(ctx, shared.srv, handle)
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	repo, err := account(ctx, fmt.Sprintf("bidder%d.test", shared.bidders.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, srv: shared.srv, repo: repo, requester: shared.requester, rival: shared.rival,
		sub: newFakeSubstrate(), clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), ctx: ctx, runs: map[*Bidder]context.Context{}, stateDir: t.TempDir(),
		price: Config{Cost: 1}}
	e.payload = e.write(e.requester, mk.ComputeVMNSID, mk.ComputeVM{Cpus: 1, Mem: 64})
	e.policy = e.write(e.requester, mk.PoliciesOpenNSID, mk.PoliciesOpen{})
	return e
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// write puts v as a new record of coll in r.
func (e *env) write(r repos.Repo, coll string, v any) atrepo.StrongRef {
	e.t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := r.Put(e.ctx, coll, feed.TID(), raw, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return atrepo.StrongRef{URI: w.URI, CID: w.CID}
}

// start runs a bidder of capacity n over the env's repo and substrate until the test ends
// (or stop is called) and returns once it has recovered its state.
func (e *env) start(n int) (b *Bidder, stop func()) {
	e.t.Helper()
	return e.startOn(n, quietRepo{e.repo})
}

// startOn is start with the bidder's repo (and so its firehose) given.
func (e *env) startOn(n int, repo repos.Repo) (b *Bidder, stop func()) {
	e.t.Helper()
	log := e.log
	if log == nil {
		log = quietLog()
	}
	b = New(Config{Repo: repo, Fetch: feed.Local(e.srv), Substrate: e.sub, Capacity: n,
		Cost: e.price.Cost, CostPerCPU: e.price.CostPerCPU, CostPerGiB: e.price.CostPerGiB, Currency: e.price.Currency, Free: e.price.Free,
		ReadyTimeout: time.Minute, Clock: e.clock, Log: log, MaxGuestCPUs: e.maxCPUs, MaxGuestMemMiB: e.maxMemMiB, StateDir: e.stateDir})
	ctx, cancel := context.WithCancel(e.ctx)
	e.runs[b] = ctx
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			e.t.Errorf("Run: %v", err)
		}
	})
	e.t.Cleanup(stop)
	select {
	case <-b.recovered:
	case err := <-done:
		e.t.Fatalf("Run ended before it recovered: %v", err)
	case <-time.After(10 * time.Second):
		e.t.Fatal("bidder did not recover")
	}
	return b, stop
}

// deliver hands b the creation of the record at ref, as its firehose would.
func (e *env) deliver(b *Bidder, ref atrepo.StrongRef) {
	e.t.Helper()
	u, err := infra.ParseATURI(ref.URI)
	if err != nil {
		e.t.Fatal(err)
	}
	b.handle(e.runs[b], repos.Event{DID: u.DID.String(), Ops: []repos.Op{{Action: "create", Collection: u.Collection.String(), RKey: u.Rkey.String(), CID: ref.CID}}})
}

// rfp writes an rfp of the requester for the env's payload and policy and hands it to b.
func (e *env) rfp(b *Bidder) atrepo.StrongRef {
	e.t.Helper()
	ref := e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy})
	e.deliver(b, ref)
	return ref
}

// accept writes the requester's accept of bid on rfp and hands it to b.
func (e *env) accept(b *Bidder, rfp, bid atrepo.StrongRef) atrepo.StrongRef {
	e.t.Helper()
	ref := e.write(e.requester, mk.AcceptNSID, mk.Accept{RFP: rfp, Bid: bid})
	e.deliver(b, ref)
	return ref
}

// release writes a delete event on receipt in by's repo and hands it to b.
func (e *env) release(b *Bidder, by repos.Repo, receipt atrepo.StrongRef) {
	e.t.Helper()
	reason := "done"
	e.deliver(b, e.write(by, mk.EventNSID, mk.Event{Receipt: receipt, Payload: mk.EventPayload{ComputeEventsVMDelete: &mk.ComputeEventsVMDelete{Reason: &reason}}}))
}

// records lists the bidder's records of coll.
func (e *env) records(coll string) []repos.Record {
	e.t.Helper()
	recs, _, err := e.repo.List(e.ctx, coll, "", 100)
	if err != nil {
		e.t.Fatal(err)
	}
	return recs
}

// bidOn is the bidder's bid on rfp, if it wrote one.
func (e *env) bidOn(rfp atrepo.StrongRef) (atrepo.StrongRef, bool) {
	e.t.Helper()
	var found []atrepo.StrongRef
	for _, r := range e.records(mk.BidNSID) {
		var bid mk.Bid
		if err := json.Unmarshal(r.Value, &bid); err != nil {
			e.t.Fatal(err)
		}
		if bid.RFP.URI == rfp.URI {
			found = append(found, atrepo.StrongRef{URI: r.URI, CID: r.CID})
		}
	}
	if len(found) > 1 {
		e.t.Fatalf("%d bids on %s, want at most one", len(found), rfp.URI)
	}
	if len(found) == 0 {
		return atrepo.StrongRef{}, false
	}
	return found[0], true
}

// mustBid is the bidder's bid on rfp; the test fails without one.
func (e *env) mustBid(rfp atrepo.StrongRef) atrepo.StrongRef {
	e.t.Helper()
	bid, ok := e.bidOn(rfp)
	if !ok {
		e.t.Fatalf("no bid on %s", rfp.URI)
	}
	return bid
}

// receiptOf is the bidder's receipt of accept, if it wrote one; more than one fails the test.
func (e *env) receiptOf(accept atrepo.StrongRef) (atrepo.StrongRef, bool) {
	e.t.Helper()
	var found []atrepo.StrongRef
	for _, r := range e.records(mk.ReceiptNSID) {
		var rc mk.Receipt
		if err := json.Unmarshal(r.Value, &rc); err != nil {
			e.t.Fatal(err)
		}
		if rc.Accept.URI == accept.URI {
			found = append(found, atrepo.StrongRef{URI: r.URI, CID: r.CID})
		}
	}
	if len(found) > 1 {
		e.t.Fatalf("%d receipts of %s, want at most one", len(found), accept.URI)
	}
	if len(found) == 0 {
		return atrepo.StrongRef{}, false
	}
	return found[0], true
}

// finalReason waits for the bidder's vm.delete event on receipt and returns its reason;
// more than one fails the test.
func (e *env) finalReason(receipt atrepo.StrongRef) string {
	e.t.Helper()
	var reasons []string
	eventually(e.t, "a final event on "+receipt.URI, func() bool {
		reasons = e.finalReasons(receipt)
		return len(reasons) > 0
	})
	time.Sleep(50 * time.Millisecond) // a second one would come at once
	if reasons = e.finalReasons(receipt); len(reasons) != 1 {
		e.t.Fatalf("final events %q, want one", reasons)
	}
	return reasons[0]
}

// started says whether the bidder wrote vm.started on receipt: after it, it watches the guest.
func (e *env) started(receipt atrepo.StrongRef) bool {
	for _, r := range e.records(mk.EventNSID) {
		ev, err := mk.DecodeEvent(r.Value)
		if err != nil {
			e.t.Fatal(err)
		}
		if ev.Receipt.URI == receipt.URI && ev.Payload.ComputeEventsVMStarted != nil {
			return true
		}
	}
	return false
}

func (e *env) finalReasons(receipt atrepo.StrongRef) []string {
	var reasons []string
	for _, r := range e.records(mk.EventNSID) {
		ev, err := mk.DecodeEvent(r.Value)
		if err != nil {
			e.t.Fatal(err)
		}
		if ev.Receipt.URI == receipt.URI && ev.Payload.ComputeEventsVMDelete != nil {
			reasons = append(reasons, *ev.Payload.ComputeEventsVMDelete.Reason)
		}
	}
	return reasons
}

// held is a running bidder of capacity 1 holding the guest of an accepted contract.
type held struct {
	b                *Bidder
	stop             func()
	rfp, bid, accept atrepo.StrongRef
	receipt          atrepo.StrongRef
	id               string
}

func (e *env) hold() held {
	e.t.Helper()
	b, stop := e.start(1)
	h := held{b: b, stop: stop, rfp: e.rfp(b)}
	h.bid = e.mustBid(h.rfp)
	h.accept = e.accept(b, h.rfp, h.bid)
	h.id = GuestID(h.accept.URI)
	rc, ok := e.receiptOf(h.accept)
	if !ok {
		e.t.Fatal("no receipt of the accept")
	}
	h.receipt = rc
	if p := e.sub.phase(h.id); p != substrate.Running {
		e.t.Fatalf("guest %s is %q, want Running", h.id, p)
	}
	eventually(e.t, "vm.started", func() bool { return e.started(h.receipt) })
	return h
}

// bidsAgain says whether b, of capacity 1, has a free place: it bids on a new rfp.
func (e *env) bidsAgain(b *Bidder) bool {
	e.t.Helper()
	_, ok := e.bidOn(e.rfp(b))
	return ok
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An unanswered bid holds its place for BidHold and no longer: within it a bidder at
// capacity does not bid, after it it bids again, and an accept of a lapsed bid whose place
// was given to another bid is declined rather than booted beyond capacity.
func TestBidHold(t *testing.T) {
	for _, c := range []struct {
		name  string
		after time.Duration
		// acceptFirst: once the second rfp was handled, the requester accepts the first bid.
		acceptFirst bool
		wantBid     bool
		wantBoot    bool
	}{
		{name: "within the hold", after: BidHold - time.Second, wantBid: false},
		{name: "hold lapsed", after: BidHold + time.Second, wantBid: true},
		{name: "accept within the hold boots", after: BidHold - time.Second, acceptFirst: true, wantBid: false, wantBoot: true},
		{name: "accept after the place was given away is declined", after: BidHold + time.Second, acceptFirst: true, wantBid: true, wantBoot: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b, _ := e.start(1)
			first := e.rfp(b)
			bid := e.mustBid(first)
			e.clock.Step(c.after)
			second := e.rfp(b)
			if _, got := e.bidOn(second); got != c.wantBid {
				t.Fatalf("bid on an rfp %s after the first bid: %v, want %v", c.after, got, c.wantBid)
			}
			if !c.acceptFirst {
				return
			}
			acc := e.accept(b, first, bid)
			_, receipted := e.receiptOf(acc)
			boots, _ := e.sub.counts(GuestID(acc.URI))
			if receipted != c.wantBoot || (boots == 1) != c.wantBoot {
				t.Fatalf("accept of the first bid: receipt %v, boots %d; want booted %v", receipted, boots, c.wantBoot)
			}
		})
	}
}

// A bidder bids only on guests it runs whole: a payload asking for more CPUs or memory than
// its largest guest gets no bid.
func TestLargestGuest(t *testing.T) {
	for _, c := range []struct {
		cpus, mem int64
		wantBid   bool
	}{{2, 1024, true}, {1, 64, true}, {3, 1024, false}, {2, 1025, false}} {
		t.Run(fmt.Sprintf("%d CPU %d MiB", c.cpus, c.mem), func(t *testing.T) {
			e := newEnv(t)
			e.maxCPUs, e.maxMemMiB = 2, 1024
			e.payload = e.write(e.requester, mk.ComputeVMNSID, mk.ComputeVM{Cpus: c.cpus, Mem: c.mem})
			b, _ := e.start(2)
			if _, got := e.bidOn(e.rfp(b)); got != c.wantBid {
				t.Fatalf("bid %v, want %v", got, c.wantBid)
			}
		})
	}
}

// A bid is priced by the size the rfp asks and states that size, free or priced; a price past
// what a cost can hold is no bid, with the reason logged.
func TestBidPricedBySize(t *testing.T) {
	for _, c := range []struct {
		name      string
		price     Config
		cpus, mem int64
		want      *mk.BidsPriced // nil: a free bid
		noBid     string         // a part of the market_no_bid line; "": a bid
	}{
		{"base only", Config{Cost: 5}, 2, 512, &mk.BidsPriced{Cost: 5, Currency: "USD", Frequency: mk.BidsPricedFrequencyHour}, ""},
		{"by size", Config{Cost: 100, CostPerCPU: 20, CostPerGiB: 8, Currency: "EUR"}, 2, 1536,
			&mk.BidsPriced{Cost: 100 + 2*20 + 12, Currency: "EUR", Frequency: mk.BidsPricedFrequencyHour}, ""},
		{"part of a GiB rounds up", Config{CostPerGiB: 10}, 1, 256, &mk.BidsPriced{Cost: 3, Currency: "USD", Frequency: mk.BidsPricedFrequencyHour}, ""},
		{"free states the size too", Config{Free: true, Cost: 9}, 3, 768, nil, ""},
		{"overflow is no bid", Config{Cost: math.MaxInt64, CostPerCPU: 1}, 1, 64, nil, "overflows"},
		{"memory overflow is no bid", Config{CostPerGiB: math.MaxInt64 / 100}, 1, 1024, nil, "overflows"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			logged := &lockedBuffer{}
			e.log = slog.New(slog.NewTextHandler(logged, nil))
			e.price, e.maxCPUs, e.maxMemMiB = c.price, 4, 4096
			e.payload = e.write(e.requester, mk.ComputeVMNSID, mk.ComputeVM{Cpus: c.cpus, Mem: c.mem})
			b, _ := e.start(2)
			rfp := e.rfp(b)
			ref, ok := e.bidOn(rfp)
			if c.noBid != "" {
				if ok {
					t.Fatalf("bid %s, want none", ref.URI)
				}
				if !strings.Contains(logged.String(), "market_no_bid") || !strings.Contains(logged.String(), c.noBid) {
					t.Fatalf("log does not say why there is no bid (%q):\n%s", c.noBid, logged.String())
				}
				return
			}
			if !ok {
				t.Fatalf("no bid; log:\n%s", logged.String())
			}
			var bid *mk.Bid
			for _, r := range e.records(mk.BidNSID) {
				if r.URI == ref.URI {
					var err error
					if bid, err = mk.DecodeBid(r.Value); err != nil {
						t.Fatal(err)
					}
				}
			}
			if bid == nil {
				t.Fatalf("bid %s not read back", ref.URI)
			}
			if d := cmp.Diff(&mk.BidSize{Cpus: c.cpus, MemMiB: c.mem}, bid.Size); d != "" {
				t.Errorf("size (-want +got):\n%s", d)
			}
			if c.want == nil {
				if bid.Payload.BidsFree == nil {
					t.Fatalf("payload %s, want a free bid", bid.Payload.Type())
				}
				return
			}
			if d := cmp.Diff(c.want, bid.Payload.BidsPriced); d != "" {
				t.Fatalf("priced payload (-want +got):\n%s", d)
			}
		})
	}
}

// lockedBuffer is a log the bidder's goroutines write while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An rfp or an accept handled once is not handled again: seen twice (a firehose replayed,
// two sources carrying it) or after a restart, there is one bid, one boot and one receipt.
func TestNotTwice(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "replayed"
		if restart {
			name = "replayed after a restart"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			b, stop := e.start(2)
			rfp := e.rfp(b)
			bid := e.mustBid(rfp)
			acc := e.accept(b, rfp, bid)
			if restart {
				stop()
				b, _ = e.start(2)
			}
			e.deliver(b, rfp)
			e.deliver(b, acc)
			e.mustBid(rfp) // fails on a second bid
			if _, ok := e.receiptOf(acc); !ok {
				t.Fatal("no receipt")
			}
			if boots, stops := e.sub.counts(GuestID(acc.URI)); boots != 1 || stops != 0 {
				t.Fatalf("boots %d, stops %d; want 1, 0", boots, stops)
			}
		})
	}
}

// A bid the requester did not take holds no place once the requester's accept of another
// bid on the same rfp is seen.
func TestAnotherAcceptFreesHold(t *testing.T) {
	for _, c := range []struct {
		name string
		// by writes the accept; sameRFP: it names the rfp the bidder bid on.
		by       func(e *env) repos.Repo
		sameRFP  bool
		wantFree bool
	}{
		{name: "requester accepts a rival's bid", by: func(e *env) repos.Repo { return e.requester }, sameRFP: true, wantFree: true},
		{name: "requester accepts a rival's bid on another rfp", by: func(e *env) repos.Repo { return e.requester }, sameRFP: false, wantFree: false},
		{name: "someone else accepts a rival's bid on the rfp", by: func(e *env) repos.Repo { return e.rival }, sameRFP: true, wantFree: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b, _ := e.start(1)
			rfp := e.rfp(b)
			e.mustBid(rfp)
			target := rfp
			if !c.sameRFP {
				target = e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy})
			}
			rivalBid := e.write(e.rival, mk.BidNSID, mk.Bid{RFP: target, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}})
			e.deliver(b, rivalBid)
			e.deliver(b, e.write(c.by(e), mk.AcceptNSID, mk.Accept{RFP: target, Bid: rivalBid}))
			if got := e.bidsAgain(b); got != c.wantFree {
				t.Fatalf("bids on a new rfp: %v, want %v", got, c.wantFree)
			}
			if boots, _ := e.sub.counts(""); boots != 0 {
				t.Fatalf("%d boots for a rival's accept", boots)
			}
		})
	}
}

// A restarted bidder matches the substrate's guests with its receipts: it adopts a guest that
// still runs (no second boot, its place held, its end watched), reports one gone while it was
// down, stops the guest of a contract that ended and a guest without a receipt.
func TestRestart(t *testing.T) {
	for _, c := range []struct {
		name string
		// running acts before the bidder stops; down changes the substrate while it is stopped.
		running, down func(e *env, h held)
		// after checks the restarted bidder.
		after func(t *testing.T, e *env, h held, b *Bidder)
	}{
		{
			name: "running guest adopted",
			after: func(t *testing.T, e *env, h held, b *Bidder) {
				if boots, stops := e.sub.counts(h.id); boots != 1 || stops != 0 || e.sub.phase(h.id) != substrate.Running {
					t.Fatalf("boots %d, stops %d, phase %q; want 1, 0, Running", boots, stops, e.sub.phase(h.id))
				}
				if e.bidsAgain(b) {
					t.Fatal("bid beyond capacity: the adopted guest holds no place")
				}
				e.sub.set(h.id, substrate.Exited)
				if r := e.finalReason(h.receipt); !strings.Contains(r, "ended by itself") {
					t.Fatalf("final reason %q, want the guest's own end", r)
				}
			},
		},
		{
			name: "guest gone while down",
			down: func(e *env, h held) { e.sub.drop(h.id) },
			after: func(t *testing.T, e *env, h held, b *Bidder) {
				if r := e.finalReason(h.receipt); !strings.Contains(r, "gone while the bidder was down") {
					t.Fatalf("final reason %q", r)
				}
				if boots, _ := e.sub.counts(h.id); boots != 1 {
					t.Fatalf("%d boots, want 1: a gone guest is reported, not booted again", boots)
				}
				if !e.bidsAgain(b) {
					t.Fatal("no bid: the gone guest still holds its place")
				}
			},
		},
		{
			name: "guest of an ended contract stopped",
			running: func(e *env, h held) {
				e.release(h.b, e.requester, h.receipt)
				e.finalReason(h.receipt)
			},
			down: func(e *env, h held) { e.sub.set(h.id, substrate.Running) }, // its stop did not take
			after: func(t *testing.T, e *env, h held, b *Bidder) {
				if _, stops := e.sub.counts(h.id); stops != 2 || e.sub.phase(h.id) != "" {
					t.Fatalf("guest of an ended contract: %d stops, phase %q; want stopped again and removed", stops, e.sub.phase(h.id))
				}
				e.finalReason(h.receipt) // still one
				if !e.bidsAgain(b) {
					t.Fatal("no bid: the ended contract holds a place")
				}
			},
		},
		{
			name: "guest without a receipt stopped",
			down: func(e *env, h held) { e.sub.set("gorphan", substrate.Running) },
			after: func(t *testing.T, e *env, h held, b *Bidder) {
				if _, stops := e.sub.counts("gorphan"); stops != 1 || e.sub.phase("gorphan") != "" {
					t.Fatalf("guest without a receipt: %d stops, phase %q; want stopped and removed", stops, e.sub.phase("gorphan"))
				}
				if p := e.sub.phase(h.id); p != substrate.Running {
					t.Fatalf("held guest is %q, want Running", p)
				}
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			h := e.hold()
			if c.running != nil {
				c.running(e, h)
			}
			h.stop()
			if c.down != nil {
				c.down(e, h)
			}
			b, _ := e.start(1)
			c.after(t, e, h, b)
		})
	}
}

// A delete event on the receipt by the accept's author releases: the guest is stopped and
// removed, the final event written once, and its place freed. Anyone else's is ignored.
func TestRelease(t *testing.T) {
	for _, c := range []struct {
		name    string
		by      func(e *env) repos.Repo
		release bool
	}{
		{name: "by the requester", by: func(e *env) repos.Repo { return e.requester }, release: true},
		{name: "by someone else", by: func(e *env) repos.Repo { return e.rival }, release: false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			h := e.hold()
			e.release(h.b, c.by(e), h.receipt)
			if !c.release {
				if p := e.sub.phase(h.id); p != substrate.Running {
					t.Fatalf("guest is %q after a stranger's delete, want Running", p)
				}
				if r := e.finalReasons(h.receipt); len(r) != 0 {
					t.Fatalf("final events %q after a stranger's delete", r)
				}
				if e.bidsAgain(h.b) {
					t.Fatal("bid beyond capacity after a stranger's delete")
				}
				return
			}
			if r := e.finalReason(h.receipt); r != "released on request" {
				t.Fatalf("final reason %q", r)
			}
			if p := e.sub.phase(h.id); p != "" {
				t.Fatalf("guest is %q after release, want removed", p)
			}
			e.release(h.b, c.by(e), h.receipt) // a second delete changes nothing
			e.finalReason(h.receipt)
			if !e.bidsAgain(h.b) {
				t.Fatal("no bid after release: the place is still held")
			}
		})
	}
}

// A guest that does not come up ends the contract without a panic and frees its place: a
// boot the substrate refuses writes nothing (the requester sees no receipt), a guest that
// fails or stays Booting beyond ReadyTimeout gets the final event with the reason.
func TestBootFails(t *testing.T) {
	for _, c := range []struct {
		name      string
		bootErr   error
		bootPhase substrate.Phase
		// timeout: the guest runs only if ReadyTimeout is stepped past.
		timeout     bool
		wantReceipt bool
		wantReason  string
	}{
		{name: "substrate refuses the boot", bootErr: substrate.Errorf(fakeKind, "boot", "", substrate.ErrBoot, "no binary"), wantReceipt: true, wantReason: "boot: "},
		{name: "guest fails before it runs", bootPhase: substrate.Failed, wantReceipt: true, wantReason: "guest did not start"},
		{name: "guest stays Booting", bootPhase: substrate.Booting, timeout: true, wantReceipt: true, wantReason: "guest did not start: context deadline exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.sub.bootErr, e.sub.bootPhase = c.bootErr, c.bootPhase
			b, _ := e.start(1)
			rfp := e.rfp(b)
			acc := e.accept(b, rfp, e.mustBid(rfp))
			rc, ok := e.receiptOf(acc)
			if ok != c.wantReceipt {
				t.Fatalf("receipt %v, want %v", ok, c.wantReceipt)
			}
			if c.timeout {
				eventually(t, "the wait for the guest to run", e.clock.HasWaiters)
				e.clock.Step(time.Minute - time.Second)
				time.Sleep(50 * time.Millisecond)
				if r := e.finalReasons(rc); len(r) != 0 {
					t.Fatalf("final event %q before ReadyTimeout", r)
				}
				e.clock.Step(time.Second)
			}
			if c.wantReceipt {
				if r := e.finalReason(rc); !strings.HasPrefix(r, c.wantReason) {
					t.Fatalf("final reason %q, want %q", r, c.wantReason)
				}
			}
			if p := e.sub.phase(GuestID(acc.URI)); p != "" {
				t.Fatalf("guest left %q", p)
			}
			if !e.bidsAgain(b) {
				t.Fatal("no bid after the failed boot: its place is still held")
			}
		})
	}
}

// Only the requester of the rfp a bid answered accepts it, naming that rfp: an accept of the
// bid by anyone else, or naming another rfp, boots nothing and leaves the bid's place held
// for the requester's own accept.
func TestAcceptOfOurBid(t *testing.T) {
	for _, c := range []struct {
		name string
		// by writes the accept; otherRFP: it names an rfp of by's other than the one bid on.
		by       func(e *env) repos.Repo
		otherRFP bool
		wantBoot bool
	}{
		{name: "by the rfp's requester", by: func(e *env) repos.Repo { return e.requester }, wantBoot: true},
		{name: "by someone else, naming the rfp", by: func(e *env) repos.Repo { return e.rival }},
		{name: "by someone else, naming an rfp of theirs", by: func(e *env) repos.Repo { return e.rival }, otherRFP: true},
		{name: "by the requester, naming another rfp", by: func(e *env) repos.Repo { return e.requester }, otherRFP: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b, _ := e.start(2) // room for the guest beside the bid: only the accept's own fault refuses it
			rfp := e.rfp(b)
			bid := e.mustBid(rfp)
			by := c.by(e)
			named := rfp
			if c.otherRFP {
				named = e.write(by, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy})
			}
			acc := e.write(by, mk.AcceptNSID, mk.Accept{RFP: named, Bid: bid})
			e.deliver(b, acc)
			_, receipted := e.receiptOf(acc)
			if boots, _ := e.sub.counts(""); receipted != c.wantBoot || (boots == 1) != c.wantBoot {
				t.Fatalf("receipt %v, boots %d; want booted %v", receipted, boots, c.wantBoot)
			}
			if c.wantBoot {
				return
			}
			if !e.bidsAgain(b) || e.bidsAgain(b) {
				t.Fatal("a stray accept freed the bid's place (or took another)")
			}
			e.accept(b, rfp, bid)
			if boots, _ := e.sub.counts(""); boots != 1 {
				t.Fatalf("the requester's own accept after a stray one: %d boots, want 1", boots)
			}
		})
	}
}

// A bidder does not bid on an rfp whose requester accepted a bid already or whose bid
// window has passed (the rfp's bidWindowMs, else 30 s): such a bid could not win and would
// hold a place of its capacity (1 here) for BidHold. An accept by anyone but the requester
// does not close an rfp.
func TestNoBidOnClosedOrAccepted(t *testing.T) {
	ms := func(n int64) *int64 { return &n }
	for _, c := range []struct {
		name string
		// window is the rfp's bidWindowMs; age how long before its delivery it was written.
		window   *int64
		age      time.Duration
		acceptBy func(e *env) repos.Repo // nil: no accept before the rfp is delivered
		wantBid  bool
	}{
		{name: "open", window: ms(5000), age: 4 * time.Second, wantBid: true},
		{name: "window passed", window: ms(5000), age: 5 * time.Second},
		{name: "no window said, within the default", age: 29 * time.Second, wantBid: true},
		{name: "no window said, past the default", age: 31 * time.Second},
		{name: "accepted by its requester", window: ms(30000), acceptBy: func(e *env) repos.Repo { return e.requester }},
		{name: "an accept by someone else", window: ms(30000), acceptBy: func(e *env) repos.Repo { return e.rival }, wantBid: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b, _ := e.start(1)
			rfp := e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy, BidWindowMs: c.window})
			if c.acceptBy != nil {
				rivalBid := e.write(e.rival, mk.BidNSID, mk.Bid{RFP: rfp, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}})
				e.deliver(b, e.write(c.acceptBy(e), mk.AcceptNSID, mk.Accept{RFP: rfp, Bid: rivalBid}))
			}
			e.clock.Step(c.age)
			e.deliver(b, rfp)
			if _, got := e.bidOn(rfp); got != c.wantBid {
				t.Fatalf("bid %v, want %v", got, c.wantBid)
			}
			if !c.wantBid && !e.bidsAgain(b) {
				t.Fatal("no bid on a new rfp: the skipped one holds a place")
			}
		})
	}
}

// The accepts remembered for BidOn do not pile up: each is kept for BidHold, long after its
// rfp was decided.
func TestAcceptsForgotten(t *testing.T) {
	e := newEnv(t)
	b, _ := e.start(1)
	accept := func() {
		rfp := e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy})
		rivalBid := e.write(e.rival, mk.BidNSID, mk.Bid{RFP: rfp, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}})
		e.deliver(b, e.write(e.requester, mk.AcceptNSID, mk.Accept{RFP: rfp, Bid: rivalBid}))
	}
	remembered := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.accepted)
	}
	accept()
	accept()
	e.clock.Step(BidHold)
	accept()
	if n := remembered(); n != 3 {
		t.Fatalf("%d accepts remembered within BidHold, want 3", n)
	}
	e.clock.Step(time.Second)
	accept()
	if n := remembered(); n != 2 {
		t.Fatalf("%d accepts remembered, want 2: those older than BidHold forgotten", n)
	}
}

// A bidder that starts after rfps were written and decided picks up only what it won: from
// its firehose's backfill it answers the accept of its bid (written while it was down) and
// bids on the rfp still open, but not on one accepted later in the same backfill, nor on one
// whose window passed; those hold no place (capacity 3: the guest, the open bid, one free).
//
// Where the firehose says its newest seq, the backfill ends at that event, not when the
// stream falls quiet: a pause of twice replayQuiet before the later accept does not make the
// bidder bid on the rfp it accepts.
func TestBackfill(t *testing.T) {
	for _, connect := range []time.Duration{0, 2 * replayQuiet} {
		t.Run(fmt.Sprintf("connected in %s", connect), func(t *testing.T) { testBackfill(t, connect, 0) })
	}
	t.Run("newest seq known, silent mid-replay", func(t *testing.T) { testBackfill(t, 0, 2*replayQuiet) })
}

// testBackfill runs the backfill row; pause > 0 replays through a firehose that says its
// newest seq and falls silent for pause after the rfp that is accepted later.
func testBackfill(t *testing.T, connect, pause time.Duration) {
	e := newEnv(t)
	b, stop := e.start(3)
	won := e.rfp(b)
	bid := e.mustBid(won)
	stop()

	window := func(n int64) *int64 { return &n }
	rfp := func(age time.Duration) atrepo.StrongRef {
		return e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Add(-age).Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy, BidWindowMs: window(10000)})
	}
	acceptWon := e.write(e.requester, mk.AcceptNSID, mk.Accept{RFP: won, Bid: bid})
	accepted := rfp(time.Second)
	rivalBid := e.write(e.rival, mk.BidNSID, mk.Bid{RFP: accepted, Payload: mk.BidPayload{BidsFree: &mk.BidsFree{}}})
	acceptRival := e.write(e.requester, mk.AcceptNSID, mk.Accept{RFP: accepted, Bid: rivalBid})
	closed := rfp(11 * time.Second)
	open := rfp(time.Second)
	// The firehose opens with an account's event, which carries no time.
	events := []repos.Event{{Seq: 1, DID: e.requester.DID()}}
	before := time.Now().Add(-time.Minute) // committed before the bidder starts
	for i, ref := range []atrepo.StrongRef{won, bid, acceptWon, accepted, rivalBid, acceptRival, closed, open} {
		u, err := infra.ParseATURI(ref.URI)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, repos.Event{Seq: int64(i + 2), DID: u.DID.String(), Time: before,
			Ops: []repos.Op{{Action: "create", Collection: u.Collection.String(), RKey: u.Rkey.String(), CID: ref.CID}}})
	}
	var repo repos.Repo = replayRepo{Repo: e.repo, events: events, connect: connect}
	if pause > 0 {
		// Seq 5 is the rfp accepted later (events[4]).
		repo = headedRepo{replayRepo: replayRepo{Repo: e.repo, events: events}, pauseAfter: 5, pause: pause}
	}
	b, _ = e.startOn(3, repo)
	eventually(t, "a bid on the open rfp", func() bool { _, ok := e.bidOn(open); return ok })
	if _, ok := e.receiptOf(acceptWon); !ok {
		t.Fatal("no receipt of the accept of its bid")
	}
	for name, ref := range map[string]atrepo.StrongRef{"accepted": accepted, "closed": closed} {
		if _, ok := e.bidOn(ref); ok {
			t.Fatalf("a bid on the %s rfp", name)
		}
	}
	if !e.bidsAgain(b) {
		t.Fatal("no place left: a skipped rfp holds one")
	}
}

// TestSameAuthor: records are by the same author only when both at-uris parse and name one
// repo; two unparsable uris are not "the same" (both would have an empty author).
func TestSameAuthor(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"at://did:plc:a/computer.socialweb.market.accept/1", "at://did:plc:a/computer.socialweb.market.rfp/2", true},
		{"at://did:plc:a/computer.socialweb.market.accept/1", "at://did:plc:b/computer.socialweb.market.rfp/2", false},
		{"not a uri", "also not", false},
		{"at://alice.test/computer.socialweb.market.accept/1", "at://alice.test/computer.socialweb.market.rfp/2", false},
		{"", "at://did:plc:a/computer.socialweb.market.rfp/2", false},
	} {
		if got := sameAuthor(tc.a, tc.b); got != tc.want {
			t.Errorf("sameAuthor(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// TestFetchBound: a requester's PDS that never answers the payload read costs the rfp, after
// FetchTimeout on the bidder's clock, with a reason that says so.
func TestFetchBound(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	hang := feed.Fetcher(func(ctx context.Context, did, coll, rkey string) (*repos.Record, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	b := New(Config{Repo: quietRepo{shared.requester}, Fetch: hang, Substrate: newFakeSubstrate(), Clock: clk,
		FetchTimeout: 10 * time.Second, Log: quietLog()})
	done := make(chan error, 1)
	go func() {
		_, err := b.evaluate(context.Background(), &mk.RFP{Payload: atrepo.StrongRef{URI: "at://did:plc:x/" + mk.ComputeVMNSID + "/p"}})
		done <- err
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(9 * time.Second)
	select {
	case err := <-done:
		t.Fatalf("evaluate ended before FetchTimeout: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	clk.Step(time.Second)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not read within 10s") {
			t.Fatalf("evaluate: %v, want the fetch bound named", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("evaluate still waits after FetchTimeout on the bidder's clock")
	}
}
