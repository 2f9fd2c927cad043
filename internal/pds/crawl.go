package pds

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atclient"
)

// crawlPolicy decides when requestCrawl goes to a relay. A relay that follows the PDS sees new
// accounts on the firehose; requestCrawl is what makes a relay (re)start following it: at
// start, and when it has something new that a relay that dropped it would miss.
type crawlPolicy struct {
	// Delay is how long a new account waits before it is announced, so a burst of sign-ups is
	// one request.
	Delay time.Duration
	// MinInterval is the least time between a successful request and the next to one relay
	// (the reference PDS sends at most one per 20 min, and drops what comes in between).
	MinInterval time.Duration
	// RetryBase and RetryMax bound the backoff after failures: RetryBase * 2^(failures-1),
	// at most RetryMax. A pending announcement is retried until it succeeds.
	RetryBase, RetryMax time.Duration
}

var defaultCrawlPolicy = crawlPolicy{Delay: 2 * time.Second, MinInterval: time.Minute,
	RetryBase: 2 * time.Second, RetryMax: 10 * time.Minute}

// relayState is what one relay's loop knows.
type relayState struct {
	Pending   bool      // something to announce
	NotBefore time.Time // earliest time it may go out (set by the first update while not pending)
	LastOK    time.Time // last success; zero: none yet
	LastTry   time.Time // last attempt
	Failures  int       // consecutive failures of the pending announcement
}

// start is the state of a relay's loop when the PDS starts: announce at once.
func (p crawlPolicy) start(now time.Time) relayState {
	return relayState{Pending: true, NotBefore: now}
}

// update records a new account. Updates while one is pending join it and do not postpone it,
// so a steady stream of sign-ups cannot hold the announcement back.
func (p crawlPolicy) update(st relayState, now time.Time) relayState {
	if !st.Pending {
		st.Pending, st.NotBefore, st.Failures = true, now.Add(p.Delay), 0
	}
	return st
}

// due says when the pending announcement goes out; ok is false when nothing is pending.
func (p crawlPolicy) due(st relayState) (at time.Time, ok bool) {
	if !st.Pending {
		return time.Time{}, false
	}
	at = st.NotBefore
	if st.Failures > 0 {
		if t := st.LastTry.Add(p.backoff(st.Failures)); t.After(at) {
			at = t
		}
		return at, true
	}
	if !st.LastOK.IsZero() {
		if t := st.LastOK.Add(p.MinInterval); t.After(at) {
			at = t
		}
	}
	return at, true
}

// backoff is the wait after the n-th consecutive failure (n >= 1).
func (p crawlPolicy) backoff(n int) time.Duration {
	d := p.RetryBase
	for i := 1; i < n && d < p.RetryMax; i++ {
		d *= 2
	}
	if d > p.RetryMax {
		d = p.RetryMax
	}
	return d
}

// attempted records the outcome of a request sent at now.
func (p crawlPolicy) attempted(st relayState, now time.Time, ok bool) relayState {
	st.LastTry = now
	if ok {
		st.Pending, st.Failures, st.LastOK = false, 0, now
		return st
	}
	st.Failures++
	return st
}

// crawler runs one loop per relay; failures are logged and retried, never reported to the
// PDS, which serves the same whether or not a relay listens.
type crawler struct {
	hostname string
	relays   []string
	policy   crawlPolicy
	client   *http.Client
	log      *slog.Logger
	updates  []chan struct{}
}

func newCrawler(hostname string, relays []string, policy crawlPolicy, log *slog.Logger) *crawler {
	c := &crawler{hostname: hostname, relays: relays, policy: policy, log: log,
		client: &http.Client{Timeout: 30 * time.Second}}
	for range relays {
		// One slot: an update that finds one waiting is already announced by it.
		c.updates = append(c.updates, make(chan struct{}, 1))
	}
	return c
}

// notify tells every relay loop that there is a new account; it never blocks.
func (c *crawler) notify() {
	if c == nil {
		return
	}
	for _, ch := range c.updates {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// run runs the relay loops until ctx ends.
func (c *crawler) run(ctx context.Context, done func()) {
	for i, relay := range c.relays {
		go func() {
			defer done()
			c.loop(ctx, relay, c.updates[i])
		}()
	}
}

func (c *crawler) loop(ctx context.Context, relay string, updates <-chan struct{}) {
	log := c.log.With("relay", relay, "hostname", c.hostname)
	st := c.policy.start(time.Now())
	// Since Go 1.23 a stopped or reset timer delivers no stale tick, so one timer serves.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var fire <-chan time.Time
		if at, ok := c.policy.due(st); ok {
			timer.Reset(time.Until(at))
			fire = timer.C
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-updates:
			st = c.policy.update(st, time.Now())
		case <-fire:
			err := c.requestCrawl(ctx, relay)
			if ctx.Err() != nil {
				return
			}
			st = c.policy.attempted(st, time.Now(), err == nil)
			if err != nil {
				log.Warn("requestCrawl failed", "err", err, "failures", st.Failures, "retry_in", c.policy.backoff(st.Failures))
			} else {
				log.Info("requestCrawl sent")
			}
		}
	}
}

func (c *crawler) requestCrawl(ctx context.Context, relay string) error {
	api := atclient.NewAPIClient(relay)
	api.Client = c.client
	return comatproto.SyncRequestCrawl(ctx, api, &comatproto.SyncRequestCrawl_Input{Hostname: c.hostname})
}
