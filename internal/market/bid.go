package market

import (
	"fmt"
	"time"
)

// RFPSeen is an rfp as a bidder read it.
type RFPSeen struct {
	URI string
	// CreatedAt is the rfp's createdAt as written (the requester's clock), from which its
	// bid window counts.
	CreatedAt string
	// WindowMs is the rfp's bidWindowMs; nil when the requester did not say (the market's
	// default window then applies).
	WindowMs *int64
}

// Window is the rfp's bid window: what it says, else DefaultBidWindow.
func (r RFPSeen) Window() time.Duration {
	if r.WindowMs == nil || *r.WindowMs < 0 {
		return DefaultBidWindow
	}
	return time.Duration(*r.WindowMs) * time.Millisecond
}

// Skip is why a bidder does not bid on an rfp ("" when it bids).
type Skip string

// Reasons BidOn skips an rfp.
const (
	// SkipAccepted: the rfp's requester accepted a bid on it already.
	SkipAccepted Skip = "Accepted"
	// SkipClosed: its bid window's deadline has passed.
	SkipClosed Skip = "WindowClosed"
	// SkipUnreadable: its createdAt is no time, so when its window closes is unknown.
	SkipUnreadable Skip = "BadCreatedAt"
)

// BidChoice is BidOn's answer: Skip empty means bid; else Reason says why not.
type BidChoice struct {
	Skip   Skip
	Reason string
}

// Bids reports whether the choice is to bid.
func (c BidChoice) Bids() bool { return c.Skip == "" }

// BidOn decides whether a bidder bids on rfp at now, given the accepts it has seen:
// accepted maps an rfp's uri to the uri of its requester's accept. A bid on an rfp already
// accepted, or whose window's deadline has passed, can never win: the requester decided
// without it, and the bid would hold a place of the bidder's capacity that a contract it
// can win needs. The window may also have closed early (every known bidder bid); an accept
// is how a bidder learns that. Whether the bidder serves the payload, its policy and its
// capacity are decided after this, on records this does not read.
func BidOn(rfp RFPSeen, accepted map[string]string, now time.Time) BidChoice {
	if acc, ok := accepted[rfp.URI]; ok {
		return BidChoice{Skip: SkipAccepted, Reason: fmt.Sprintf("the requester accepted %s", acc)}
	}
	opened, err := time.Parse(time.RFC3339Nano, rfp.CreatedAt)
	if err != nil {
		return BidChoice{Skip: SkipUnreadable, Reason: fmt.Sprintf("createdAt %q is not a datetime, so its bid window is unknown", rfp.CreatedAt)}
	}
	if closes := opened.Add(rfp.Window()); !now.Before(closes) {
		return BidChoice{Skip: SkipClosed, Reason: fmt.Sprintf("its bid window of %s closed at %s, %s ago",
			rfp.Window(), closes.UTC().Format(time.RFC3339Nano), now.Sub(closes).Round(time.Millisecond))}
	}
	return BidChoice{}
}
