package market

import (
	"strings"
	"testing"
	"time"
)

func TestBidOn(t *testing.T) {
	const rfp = "at://did:plc:req/com.publicdomainrelay.temp.market.rfp/3l"
	opened := time.Date(2026, 1, 2, 3, 4, 5, 600_000_000, time.UTC)
	ms := func(n int64) *int64 { return &n }
	accepted := map[string]string{rfp: "at://did:plc:req/com.publicdomainrelay.temp.market.accept/3m"}
	for _, c := range []struct {
		name      string
		createdAt string
		window    *int64
		accepted  map[string]string
		at        time.Duration // now - opened
		want      Skip
		reason    string // in the reason
	}{
		{name: "open, its own window", window: ms(5000), at: 4999 * time.Millisecond},
		{name: "at its deadline", window: ms(5000), at: 5 * time.Second, want: SkipClosed, reason: "bid window of 5s closed at 2026-01-02T03:04:10.6Z, 0s ago"},
		{name: "past its deadline", window: ms(5000), at: 2 * time.Minute, want: SkipClosed, reason: "1m55s ago"},
		{name: "no window said: the default's", at: 29 * time.Second},
		{name: "no window said, past the default", at: 30 * time.Second, want: SkipClosed, reason: "window of 30s"},
		{name: "a zero window is closed at once", window: ms(0), at: 0, want: SkipClosed},
		{name: "a negative window is the default", window: ms(-1), at: 10 * time.Second},
		{name: "a long window is open after the default's", window: ms(600_000), at: 5 * time.Minute},
		{name: "accepted within its window", window: ms(30_000), accepted: accepted, at: time.Second, want: SkipAccepted, reason: "accept/3m"},
		{name: "accepted and closed: accepted first", window: ms(1000), accepted: accepted, at: time.Hour, want: SkipAccepted},
		{name: "an accept of another rfp", window: ms(30_000), accepted: map[string]string{rfp + "x": "a"}, at: time.Second},
		{name: "a clock behind the requester's", window: ms(5000), at: -3 * time.Second},
		{name: "createdAt not a time", createdAt: "yesterday", window: ms(5000), want: SkipUnreadable, reason: `"yesterday"`},
		{name: "createdAt without fraction", createdAt: "2026-01-02T03:04:05Z", window: ms(1000), at: 500 * time.Millisecond, want: SkipClosed},
	} {
		t.Run(c.name, func(t *testing.T) {
			created := c.createdAt
			if created == "" {
				created = opened.Format(time.RFC3339Nano)
			}
			got := BidOn(RFPSeen{URI: rfp, CreatedAt: created, WindowMs: c.window}, c.accepted, opened.Add(c.at))
			if got.Skip != c.want || got.Bids() != (c.want == "") {
				t.Fatalf("BidOn = %+v, want skip %q", got, c.want)
			}
			if !strings.Contains(got.Reason, c.reason) {
				t.Fatalf("reason %q, want it to contain %q", got.Reason, c.reason)
			}
		})
	}
}
