// Package market holds the decisions of the compute market protocol
// (com.publicdomainrelay.temp.market.*) as pure functions: who may bid, when the bid window
// closes, which bid wins, whether a receipt binds to our accept, what a bidder's policy
// says, and the requester's next phase. No I/O: the requester controller and the bidder
// read records, call these, and write what they return. See docs/market.md.
package market

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"socialweb.computer/api/v1alpha1"
)

// Defaults of the policyArgs the requester reads.
const (
	DefaultBidWindow    = 30 * time.Second
	DefaultAnswerWait   = 60 * time.Second
	DefaultReadyTimeout = 300 * time.Second
	// ArgBidWindow, ArgAnswerWait: policyArgs keys, in seconds.
	ArgBidWindow  = "bidWindowSec"
	ArgAnswerWait = "answerTimeoutSec"
	// ArgMaxCost and ArgCurrency: policyArgs keys, the most a bid may cost (a whole number
	// in the bids' unit) and the currency it is counted in.
	ArgMaxCost  = "maxCost"
	ArgCurrency = "currency"
)

// PriceCap is the most a winning bid may cost. A free bid is always within it; a priced
// bid must be in Currency and cost at most Max.
type PriceCap struct {
	Set      bool
	Max      int64
	Currency string
}

// PriceCapArg reads the cap from policyArgs maxCost and currency: none when maxCost is
// absent; maxCost must be a whole number >= 0 and comes with a currency.
func PriceCapArg(args map[string]string) (PriceCap, error) {
	v, ok := args[ArgMaxCost]
	if !ok || v == "" {
		return PriceCap{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return PriceCap{}, fmt.Errorf("policyArgs.%s %q is not a whole number >= 0", ArgMaxCost, v)
	}
	c := strings.TrimSpace(args[ArgCurrency])
	if c == "" {
		return PriceCap{}, fmt.Errorf("policyArgs.%s needs policyArgs.%s (the currency it is counted in)", ArgMaxCost, ArgCurrency)
	}
	return PriceCap{Set: true, Max: n, Currency: c}, nil
}

// Allows says why a bid is over the cap, or nil.
func (p PriceCap) Allows(b Bid) error {
	if !p.Set || b.Free {
		return nil
	}
	if b.Currency != p.Currency {
		return fmt.Errorf("costs %d %s, and maxCost is in %s", b.Cost, b.Currency, p.Currency)
	}
	if b.Cost > p.Max {
		return fmt.Errorf("costs %d %s, more than maxCost %d", b.Cost, b.Currency, p.Max)
	}
	return nil
}

// Reasons a contract ends Failed (the Ready condition reason and the first word of the message).
const (
	ReasonNoBids         = "NoBids"
	ReasonAllRefused     = "AllRefused"
	ReasonWinnerSilent   = "WinnerSilent"
	ReasonVMReadyTimeout = "VMReadyTimeout"
	ReasonBidderLost     = "BidderLost"
	ReasonBadSpec        = "InvalidSpec"
	// ReasonSecretsUndelivered: spec.secretsRef is set and the secrets did not reach the
	// winner within the ready timeout.
	ReasonSecretsUndelivered = "SecretsUndelivered"
)

// Origin is the time a deadline counts from, for a time read back from the API: status and
// spec keep metav1.Time to the second, so the event happened somewhere in [t, t+1s). Counting
// from the end of that second, a deadline never falls before its nominal length after the
// event; it may fall up to a second after. The zero time stays zero (no event yet).
func Origin(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Truncate(time.Second).Add(time.Second)
}

// SecondsArg reads a non-negative number of seconds from args[key], def when absent.
func SecondsArg(args map[string]string, key string, def time.Duration) (time.Duration, error) {
	v, ok := args[key]
	if !ok || v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("policyArgs.%s: %q is not a non-negative number of seconds", key, v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// Bidders is the set of bidders a requester waits for: the DIDs of the live offerings it has
// seen plus spec.bidderDids, minus spec.denyBidderDids, sorted and without duplicates. When
// bidderDids is set it is the whole set (offerings of others do not widen it). A bidder the
// offering rule (isolation, layers, architecture) does not allow is not waited for: its bid
// would be refused.
func Bidders(offerings, bidderDids, denyBidderDids []string, rule OfferingRule) []string {
	base := offerings
	if len(bidderDids) > 0 {
		base = bidderDids
	}
	seen := map[string]bool{}
	var out []string
	for _, d := range base {
		if d == "" || seen[d] || slices.Contains(denyBidderDids, d) || rule.Allows(d) != nil {
			continue
		}
		seen[d] = true
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Bid is a bid as the requester saw it.
type Bid struct {
	URI, CID string
	Bidder   string
	// Free is a bids.free bid (cost 0); else Cost and Currency are the priced bid's.
	Free     bool
	Cost     int64
	Currency string
	// Unknown is a bid payload of a kind we do not know; it is refused.
	Unknown bool
	// Size is the guest size the bid states it is for; nil: exactly what the rfp asks.
	Size *Size
}

// Price is the cost compared between bids: 0 for a free bid.
func (b Bid) Price() int64 {
	if b.Free {
		return 0
	}
	return b.Cost
}

// WindowClose says whether the bid window of an rfp written at opened is closed at now: at
// opened+window, or earlier once every bidder in bidders has a bid in answered. When it is
// open, wait is how long until it closes by the deadline.
func WindowClose(now, opened time.Time, window time.Duration, bidders []string, answered map[string]bool) (closed bool, wait time.Duration) {
	deadline := opened.Add(window)
	if !now.Before(deadline) {
		return true, 0
	}
	if len(bidders) > 0 {
		all := true
		for _, d := range bidders {
			if !answered[d] {
				all = false
				break
			}
		}
		if all {
			return true, 0
		}
	}
	return false, deadline.Sub(now)
}

// Refusal is a bid not taken and why.
type Refusal struct {
	Bid    Bid
	Reason string
}

// Choose picks the winner among bids: the lowest price among those whose bidder is allowed
// (in bidderDids when that is set, not in denyBidderDids), for at least the size the rfp
// asks (asked; a bid stating no size is for exactly that), within the policy's price cap,
// and that the policy allows. Ties
// go to the lexically smallest bidder DID, then bid URI, so every requester picks the same.
// Bids of a currency other than the first allowed one's are refused (prices do not compare).
// A bid whose bidder's offering does not state what the rule requires is refused,
// the reason naming the requirement.
func Choose(bids []Bid, asked Size, bidderDids, deny []string, policy Policy, rule OfferingRule) (winner *Bid, refused []Refusal) {
	var ok []Bid
	for _, b := range bids {
		switch {
		case slices.Contains(deny, b.Bidder):
			refused = append(refused, Refusal{b, "bidder denied by denyBidderDids"})
		case len(bidderDids) > 0 && !slices.Contains(bidderDids, b.Bidder):
			refused = append(refused, Refusal{b, "bidder not in bidderDids"})
		case b.Unknown:
			refused = append(refused, Refusal{b, "unknown bid kind"})
		case b.Size != nil && !b.Size.Covers(asked):
			// A bid priced for a smaller guest than asked is cheaper for that, and its
			// bidder would boot less than the contract asks.
			refused = append(refused, Refusal{b, fmt.Sprintf("the bid is for %s; the rfp asks %s", *b.Size, asked)})
		case rule.Allows(b.Bidder) != nil:
			refused = append(refused, Refusal{b, rule.Allows(b.Bidder).Error()})
		case policy.PriceCap.Allows(b) != nil:
			refused = append(refused, Refusal{b, policy.PriceCap.Allows(b).Error()})
		default:
			if err := policy.Allows(Candidate{Bidder: b.Bidder}); err != nil {
				refused = append(refused, Refusal{b, err.Error()})
			} else {
				ok = append(ok, b)
			}
		}
	}
	sort.SliceStable(ok, func(i, j int) bool {
		a, c := ok[i], ok[j]
		if a.Price() != c.Price() {
			return a.Price() < c.Price()
		}
		if a.Bidder != c.Bidder {
			return a.Bidder < c.Bidder
		}
		return a.URI < c.URI
	})
	var cur string
	for i := range ok {
		b := ok[i]
		if b.Free {
			if winner == nil {
				winner = &ok[i]
			}
			continue
		}
		if cur == "" {
			cur = b.Currency
		}
		if b.Currency != cur {
			refused = append(refused, Refusal{b, fmt.Sprintf("currency %s, not %s", b.Currency, cur)})
			continue
		}
		if winner == nil {
			winner = &ok[i]
		}
	}
	return winner, refused
}

// Ref is a strong reference: a record's at-uri and CID.
type Ref struct{ URI, CID string }

// ReceiptSeen is a receipt as the requester read it.
type ReceiptSeen struct {
	URI, CID string
	// Author is the DID of the repo holding the receipt.
	Author string
	// Accept is the receipt's accept strongRef, AcceptCID its cid field.
	Accept    Ref
	AcceptCID string
}

// Binds says whether a receipt binds to our accept: written by the winner, naming our accept
// by URI and by the CID we wrote (both the strongRef's and the cid field).
func Binds(r ReceiptSeen, accept Ref, winner string) error {
	switch {
	case r.Author != winner:
		return fmt.Errorf("receipt by %s, not the winner %s", r.Author, winner)
	case r.Accept.URI != accept.URI:
		return fmt.Errorf("receipt names accept %s, not %s", r.Accept.URI, accept.URI)
	case r.AcceptCID != accept.CID || r.Accept.CID != accept.CID:
		return fmt.Errorf("receipt binds cid %s, our accept is %s", r.AcceptCID, accept.CID)
	}
	return nil
}

// Policy is an rfp's policy as read from its record.
type Policy struct {
	// NSID is the policy record's collection (policies.open, policies.onlyMe, ...).
	NSID string
	// RequesterDID is onlyMe's requesterDid.
	RequesterDID string
	// PriceCap is the requester's maxCost (policyArgs): bids over it are refused.
	PriceCap PriceCap
	// MaxCPUs, when > 0, bounds the CPUs of the guest asked for. No policy record carries it
	// yet (the lexicons have no CPU-bound policy); it is here for the rule and its test.
	MaxCPUs int64
	// Err is set when the policy record could not be read or decoded: it denies.
	Err error
}

// Candidate is what a policy judges: who would win, and what they would run.
type Candidate struct {
	Bidder string
	CPUs   int64
}

// Policy NSIDs.
const (
	PolicyOpen   = "com.publicdomainrelay.temp.market.policies.open"
	PolicyOnlyMe = "com.publicdomainrelay.temp.market.policies.onlyMe"
)

// Allows evaluates the policy: nil allows; any error (an unknown policy, a policy that could
// not be read) denies, with the reason.
func (p Policy) Allows(c Candidate) error {
	if p.Err != nil {
		return fmt.Errorf("policy unreadable: %v", p.Err)
	}
	if p.MaxCPUs > 0 && c.CPUs > p.MaxCPUs {
		return fmt.Errorf("policy allows at most %d CPUs, asked %d", p.MaxCPUs, c.CPUs)
	}
	switch p.NSID {
	case PolicyOpen:
		return nil
	case PolicyOnlyMe:
		if p.RequesterDID == "" {
			return fmt.Errorf("policy onlyMe names no requester")
		}
		if c.Bidder != p.RequesterDID {
			return fmt.Errorf("policy onlyMe: only %s may win", p.RequesterDID)
		}
		return nil
	default:
		return fmt.Errorf("unknown policy %q", p.NSID)
	}
}

// PolicyName maps spec.policy to the policy record's NSID: "" and "open" are open,
// "only_me"/"onlyMe" is onlyMe; anything else is an error.
func PolicyName(spec string) (string, error) {
	switch strings.TrimSpace(spec) {
	case "", "open":
		return PolicyOpen, nil
	case "only_me", "onlyMe":
		return PolicyOnlyMe, nil
	}
	return "", fmt.Errorf("unknown policy %q (open, only_me)", spec)
}

// Phase aliases the API's phases.
type Phase = v1alpha1.ComputeContractPhase

// Action is a write the requester makes before it records the decided phase.
type Action string

const (
	ActNone Action = ""
	// ActRFP writes the compute.vm payload, the policy record and the rfp.
	ActRFP Action = "rfp"
	// ActRFPAgain writes the rfp once more, with a window of its own (payload and policy
	// are the first rfp's): its first window passed with no bid while this requester was not
	// watching it.
	ActRFPAgain Action = "rfpAgain"
	// ActAccept writes the accept for Decision.Winner.
	ActAccept Action = "accept"
	// ActDelete writes an event with a compute.events.vm.delete payload on the receipt.
	ActDelete Action = "delete"
	// ActDeliverSecrets: hand the secrets to the winner point to point (never a record).
	ActDeliverSecrets Action = "deliverSecrets"
)

// State is what the requester knows of one contract at Now.
type State struct {
	Now   time.Time
	Phase Phase
	// Release: spec.release is set or the object is being deleted.
	Release bool

	// RFPAt is when the rfp was written (zero: not yet).
	RFPAt time.Time
	// WatchingSince is when this requester began watching the market (its process, or its
	// leadership, started). A window that opened before it was not watched whole: the
	// bidders it knows may have been down with it (up's own bidder is), and a bid they
	// would have made is missing for that, not for want of capacity.
	WatchingSince time.Time
	// RFPAgain: the rfp in force is the one written again (ActRFPAgain happens once).
	RFPAgain     bool
	Window       time.Duration
	AnswerWait   time.Duration
	ReadyTimeout time.Duration
	Bidders      []string
	BidderDids   []string
	Deny         []string
	Policy       Policy
	// Offering is spec.requireIsolation, spec.requireLayers and spec.requireArch with what
	// the offerings stated.
	Offering OfferingRule
	// Asked is the guest size the rfp's payload asks (zero: not known, no bid is too small).
	Asked Size
	Bids  []Bid

	// Accept is our accept (zero: none yet), Winner its bidder, AcceptAt when we wrote it.
	Accept   Ref
	Winner   string
	AcceptAt time.Time
	// Receipt is set once a receipt that Binds arrived.
	Receipt *ReceiptSeen
	// Started: the winner's vm.started event arrived. Ended: the winner's final event (a
	// vm.delete on the receipt, written when it stopped the guest or the guest exited).
	Started bool
	Ended   bool
	// EndedReason is the reason the winner's final event gives (its words: quoted, bounded,
	// when a message repeats it).
	EndedReason string
	// SecretsWanted: spec.secretsRef is set; SecretsDelivered: the winner took them. A contract
	// that wants secrets is not Held before they are delivered.
	SecretsWanted    bool
	SecretsDelivered bool
	// DeleteAt is when we wrote our delete event (zero: not yet).
	DeleteAt time.Time
	// ReleaseAt is when the release was asked for (spec.release.requestedAt or the deletion).
	ReleaseAt time.Time
}

// Decision is what to do next and the phase to record after doing it.
type Decision struct {
	Action Action
	Winner *Bid
	Phase  Phase
	// Reason is a condition reason; Message a sentence naming the cause.
	Reason, Message string
	// Refused lists the bids not taken (when the window closed).
	Refused []Refusal
	// RequeueAfter is the next deadline (0: none; events requeue the contract).
	RequeueAfter time.Duration
}

func fail(reason, format string, a ...any) Decision {
	return Decision{Phase: v1alpha1.ComputeContractFailed, Reason: reason, Message: reason + ": " + fmt.Sprintf(format, a...)}
}

func until(now, t time.Time) time.Duration {
	d := t.Sub(now)
	if d < time.Millisecond {
		d = time.Millisecond
	}
	return d
}

// Next is the requester's state machine:
//
//	Pending -> Requesting (rfp written) -> Held (vm.started) -> Releasing (delete written) -> Released
//
// With secrets wanted, a bound receipt first asks for their delivery (ActDeliverSecrets)
// until the winner took them, and Held waits for that as well as for vm.started.
//
// and Failed from any of them with a reason that names the cause: no bids, every bid refused,
// a winner that never answered the accept, a guest not started within the ready timeout, a
// bidder that never answered the delete. Released and Failed are final; a Failed contract
// whose guest was won still has its delete written (ActDelete) before it is recorded.
func Next(s State) Decision {
	switch StateOf(s) {
	case StageFinal:
		return Decision{Phase: s.Phase}
	case StageReleasing:
		return nextRelease(s)
	case StageUnpublished:
		return Decision{Action: ActRFP, Phase: v1alpha1.ComputeContractRequesting, Message: "rfp written; waiting for bids"}
	case StageBidding:
		return nextBidding(s)
	case StageAccepted:
		return nextAccepted(s)
	}
	return nextBound(s)
}

// nextBidding: the rfp is out and nothing accepted. The window closes at its deadline or
// once every bidder answered; then the cheapest allowed bid is accepted, or the contract
// fails with no bids or every bid refused. A window with no bid that opened before this
// requester was watching is opened again, once, with a new rfp: a crash of the requester
// with its bidders must not end the contract.
func nextBidding(s State) Decision {
	now := s.Now
	answered := map[string]bool{}
	for _, b := range s.Bids {
		answered[b.Bidder] = true
	}
	closed, wait := WindowClose(now, s.RFPAt, s.Window, s.Bidders, answered)
	if !closed {
		msg := fmt.Sprintf("%d bid(s) from %d bidder(s) so far", len(s.Bids), len(s.Bidders))
		if s.Offering.Requires() {
			msg += fmt.Sprintf("; %d known bidder(s) meet %s for %s guests", len(s.Bidders), s.Offering, s.Offering.Kind)
		}
		return Decision{Phase: v1alpha1.ComputeContractRequesting, Message: msg, RequeueAfter: wait}
	}
	w, refused := Choose(s.Bids, s.Asked, s.BidderDids, s.Deny, s.Policy, s.Offering)
	if w == nil {
		if len(s.Bids) == 0 {
			if !s.RFPAgain && s.RFPAt.Before(s.WatchingSince) {
				return Decision{Action: ActRFPAgain, Phase: v1alpha1.ComputeContractRequesting,
					Message:      fmt.Sprintf("no bid within %s of an rfp written before this requester started; rfp written again, waiting for bids", s.Window),
					RequeueAfter: max(s.Window, time.Millisecond)}
			}
			req := ""
			if s.Offering.Requires() {
				req = ", " + s.Offering.String()
			}
			return fail(ReasonNoBids, "no bid within %s from %d known bidder(s) (policy %s%s)", s.Window, len(s.Bidders), shortPolicy(s.Policy.NSID), req)
		}
		parts := make([]string, 0, len(refused))
		for _, r := range refused {
			parts = append(parts, r.Bid.Bidder+": "+r.Reason)
		}
		d := fail(ReasonAllRefused, "every bid refused: %s", strings.Join(parts, "; "))
		d.Refused = refused
		return d
	}
	return Decision{Action: ActAccept, Winner: w, Refused: refused, Phase: v1alpha1.ComputeContractRequesting,
		Message: fmt.Sprintf("accepted %s's bid; waiting for its receipt", w.Bidder), RequeueAfter: s.AnswerWait}
}

// nextAccepted: the accept is written; the winner has the answer wait to write its receipt.
func nextAccepted(s State) Decision {
	now := s.Now
	if dl := s.AcceptAt.Add(s.AnswerWait); now.Before(dl) {
		return Decision{Phase: v1alpha1.ComputeContractRequesting, Message: fmt.Sprintf("waiting for %s's receipt", s.Winner), RequeueAfter: until(now, dl)}
	}
	return fail(ReasonWinnerSilent, "the winner %s wrote no receipt within %s of the accept", s.Winner, s.AnswerWait)
}

// maxReportedReason bounds how much of a bidder's stated reason a message repeats.
const maxReportedReason = 256

// reportedReason is ": <reason>" of a bidder's final event, quoted (a peer's words: control
// characters escaped) and cut to maxReportedReason bytes; "" when it gave none.
func reportedReason(reason string) string {
	if reason == "" {
		return ""
	}
	if len(reason) > maxReportedReason {
		reason = strings.ToValidUTF8(reason[:maxReportedReason], "") + "..."
	}
	return ": " + strconv.Quote(reason)
}

// nextBound: the receipt binds. The guest ended, or the secrets go to the winner, or the
// guest started (Held), or the ready timeout fails it and has its delete written.
func nextBound(s State) Decision {
	now := s.Now
	if s.Ended {
		return Decision{Phase: v1alpha1.ComputeContractReleased, Reason: "GuestEnded", Message: "the guest ended by itself and " + s.Winner + " reported it" + reportedReason(s.EndedReason)}
	}
	if s.SecretsWanted && !s.SecretsDelivered {
		if dl := s.AcceptAt.Add(s.ReadyTimeout); now.Before(dl) {
			return Decision{Action: ActDeliverSecrets, Phase: v1alpha1.ComputeContractRequesting,
				Message: "receipt bound; delivering the secrets to " + s.Winner, RequeueAfter: min(time.Second, until(now, dl))}
		}
		d := fail(ReasonSecretsUndelivered, "the secrets were not delivered to %s within vmReadyTimeoutSec (%s); guest released", s.Winner, s.ReadyTimeout)
		if s.DeleteAt.IsZero() {
			d.Action = ActDelete
		}
		return d
	}
	if s.Started {
		return Decision{Phase: v1alpha1.ComputeContractHeld, Reason: "Started", Message: "guest started by " + s.Winner}
	}
	if dl := s.AcceptAt.Add(s.ReadyTimeout); now.Before(dl) {
		return Decision{Phase: v1alpha1.ComputeContractRequesting, Message: "receipt bound; waiting for vm.started", RequeueAfter: until(now, dl)}
	}
	d := fail(ReasonVMReadyTimeout, "no vm.started from %s within vmReadyTimeoutSec (%s); guest released", s.Winner, s.ReadyTimeout)
	if s.DeleteAt.IsZero() {
		d.Action = ActDelete
	}
	return d
}

func nextRelease(s State) Decision {
	now := s.Now
	if s.Accept.URI == "" {
		return Decision{Phase: v1alpha1.ComputeContractReleased, Reason: "NothingHeld", Message: "released before any bid was accepted"}
	}
	if s.Ended {
		return Decision{Phase: v1alpha1.ComputeContractReleased, Reason: "Released", Message: s.Winner + " released the guest"}
	}
	if s.Receipt == nil {
		// A receipt may still come for the accept: wait for it (bounded) so the delete can name it.
		start := s.AcceptAt
		if s.ReleaseAt.After(start) {
			start = s.ReleaseAt
		}
		if dl := start.Add(s.AnswerWait); now.Before(dl) {
			return Decision{Phase: v1alpha1.ComputeContractReleasing, Message: "release asked; waiting for the winner's receipt to name in the delete", RequeueAfter: until(now, dl)}
		}
		return fail(ReasonBidderLost, "release asked but %s wrote no receipt within %s", s.Winner, s.AnswerWait)
	}
	if s.DeleteAt.IsZero() {
		return Decision{Action: ActDelete, Phase: v1alpha1.ComputeContractReleasing, Message: "delete written; waiting for " + s.Winner, RequeueAfter: s.AnswerWait}
	}
	if dl := s.DeleteAt.Add(s.AnswerWait); now.Before(dl) {
		return Decision{Phase: v1alpha1.ComputeContractReleasing, Message: "delete written; waiting for " + s.Winner, RequeueAfter: until(now, dl)}
	}
	return fail(ReasonBidderLost, "%s did not answer the delete within %s", s.Winner, s.AnswerWait)
}

func shortPolicy(nsid string) string {
	if i := strings.LastIndex(nsid, "."); i >= 0 {
		return nsid[i+1:]
	}
	return nsid
}
