package bidder

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
)

// cursorRepo is a replayRepo whose firehose notes the cursor each subscription asks from.
type cursorRepo struct {
	replayRepo
	mu    *sync.Mutex
	asked *[]int64
}

func (r cursorRepo) Events() repos.EventSource { return cursorSource(r) }

type cursorSource cursorRepo

func (s cursorSource) Subscribe(ctx context.Context, cursor *int64, fn func(repos.Event) error) error {
	s.mu.Lock()
	c := int64(-1)
	if cursor != nil {
		c = *cursor
	}
	*s.asked = append(*s.asked, c)
	s.mu.Unlock()
	return replaySource(s.replayRepo).Subscribe(ctx, cursor, fn)
}

// A bidder with a state dir saves the seq of the last event it decided on, per firehose
// URL, and a restarted one subscribes from there: the rfp it bid on is not handed to it
// again, and the rfp committed while it was down is. An event it failed to handle keeps the
// cursor before it.
func TestRestartResumesFromSavedCursor(t *testing.T) {
	e := newEnv(t)
	event := func(seq int64, ref atrepo.StrongRef) repos.Event {
		u, err := infra.ParseATURI(ref.URI)
		if err != nil {
			t.Fatal(err)
		}
		// Committed after the bidder starts: live, decided at once.
		return repos.Event{Seq: seq, DID: u.DID.String(), Time: time.Now().Add(time.Hour),
			Ops: []repos.Op{{Action: "create", Collection: u.Collection.String(), RKey: u.Rkey.String(), CID: ref.CID}}}
	}
	rfp := func() atrepo.StrongRef {
		return e.write(e.requester, mk.RFPNSID, mk.RFP{CreatedAt: e.clock.Now().Format(time.RFC3339Nano), Payload: e.payload, Policy: e.policy})
	}
	var mu sync.Mutex
	var asked []int64
	run := func(events []repos.Event) (stop func()) {
		_, stop = e.startOn(3, cursorRepo{replayRepo: replayRepo{Repo: e.repo, events: events}, mu: &mu, asked: &asked})
		return stop
	}
	waitBid := func(ref atrepo.StrongRef) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, ok := e.bidOn(ref); ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no bid on %s", ref.URI)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	first := rfp()
	events := []repos.Event{{Seq: 1, DID: e.requester.DID()}, event(7, first)}
	stop := run(events)
	waitBid(first)
	stop()
	saved := func() int64 {
		t.Helper()
		c, err := feed.OpenCursors(filepath.Join(e.stateDir, CursorsFile))
		if err != nil {
			t.Fatal(err)
		}
		return c.Get(e.repo.Endpoint())
	}
	if got := saved(); got != 7 {
		t.Fatalf("saved cursor of %s: %d, want 7", e.repo.Endpoint(), got)
	}

	// An event whose handling fails (an accept that does not decode) holds the cursor
	// before it, whatever is handled after it: a restart sees it again.
	broken := e.write(e.requester, mk.AcceptNSID, map[string]any{"$type": mk.AcceptNSID, "rfp": "not a strongRef"})
	second := rfp()
	events = append(events, event(8, broken), event(9, second))
	stop = run(events)
	waitBid(second)
	stop()
	if got := saved(); got != 7 {
		t.Fatalf("saved cursor past an event not handled: %d, want 7", got)
	}
	stop = run(events)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(asked)
		mu.Unlock()
		if n == 3 || time.Now().After(deadline) {
			break
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || asked[0] != 0 || asked[1] != 7 || asked[2] != 7 {
		t.Fatalf("subscriptions asked from %v, want [0 7 7]", asked)
	}
	e.mustBid(first) // one bid each: bidOn fails the test on a second
	e.mustBid(second)
}
