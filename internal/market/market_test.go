package market

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"socialweb.computer/api/v1alpha1"
)

func TestBidders(t *testing.T) {
	for _, c := range []struct {
		name                string
		offers, allow, deny []string
		want                []string
	}{
		{"offerings only", []string{"did:b", "did:a", "did:b"}, nil, nil, []string{"did:a", "did:b"}},
		{"bidderDids replace offerings", []string{"did:a"}, []string{"did:c", "did:d"}, nil, []string{"did:c", "did:d"}},
		{"deny removes", []string{"did:a", "did:b"}, nil, []string{"did:a"}, []string{"did:b"}},
		{"deny removes from bidderDids", nil, []string{"did:a", "did:b"}, []string{"did:b"}, []string{"did:a"}},
		{"empty", nil, nil, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Bidders(c.offers, c.allow, c.deny, OfferingRule{}); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestWindowClose(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name     string
		now      time.Duration
		window   time.Duration
		bidders  []string
		answered []string
		closed   bool
		wait     time.Duration
	}{
		{"open", 1 * time.Second, 30 * time.Second, []string{"a", "b"}, []string{"a"}, false, 29 * time.Second},
		{"deadline", 30 * time.Second, 30 * time.Second, []string{"a"}, nil, true, 0},
		{"early when all answered", time.Second, 30 * time.Second, []string{"a", "b"}, []string{"b", "a"}, true, 0},
		{"zero window", 0, 0, []string{"a"}, nil, true, 0},
		{"no bidders waits the window", time.Second, 5 * time.Second, nil, nil, false, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := map[string]bool{}
			for _, a := range c.answered {
				ans[a] = true
			}
			closed, wait := WindowClose(t0.Add(c.now), t0, c.window, c.bidders, ans)
			if closed != c.closed || wait != c.wait {
				t.Fatalf("got %v %v, want %v %v", closed, wait, c.closed, c.wait)
			}
		})
	}
}

func TestChoose(t *testing.T) {
	open := Policy{NSID: PolicyOpen}
	p := func(bidder string, cost int64) Bid {
		return Bid{URI: "at://" + bidder + "/bid/1", Bidder: bidder, Cost: cost, Currency: "USD"}
	}
	for _, c := range []struct {
		name        string
		bids        []Bid
		allow, deny []string
		policy      Policy
		want        string
		refused     int
	}{
		{"cheapest", []Bid{p("did:a", 30), p("did:b", 10), p("did:c", 20)}, nil, nil, open, "did:b", 0},
		{"free costs 0", []Bid{p("did:a", 1), {URI: "u", Bidder: "did:z", Free: true}}, nil, nil, open, "did:z", 0},
		{"tie by DID", []Bid{p("did:b", 5), p("did:a", 5)}, nil, nil, open, "did:a", 0},
		{"deny", []Bid{p("did:a", 1), p("did:b", 9)}, nil, []string{"did:a"}, open, "did:b", 1},
		{"bidderDids", []Bid{p("did:a", 1), p("did:b", 9)}, []string{"did:b"}, nil, open, "did:b", 1},
		{"onlyMe", []Bid{p("did:a", 1), p("did:me", 9)}, nil, nil, Policy{NSID: PolicyOnlyMe, RequesterDID: "did:me"}, "did:me", 1},
		{"policy error denies all", []Bid{p("did:a", 1)}, nil, nil, Policy{Err: errors.New("boom")}, "", 1},
		{"unknown kind", []Bid{{Bidder: "did:a", Unknown: true}}, nil, nil, open, "", 1},
		{"other currency refused", []Bid{p("did:a", 1), {Bidder: "did:b", Cost: 0, Currency: "EUR"}}, nil, nil, open, "did:b", 1},
		{"maxCost: the cheapest within it", []Bid{p("did:a", 30), p("did:b", 10)}, nil, nil, capped(20, "USD"), "did:b", 1},
		{"maxCost: over it is refused", []Bid{p("did:a", 30), p("did:b", 21)}, nil, nil, capped(20, "USD"), "", 2},
		{"maxCost: at it is taken", []Bid{p("did:a", 20)}, nil, nil, capped(20, "USD"), "did:a", 0},
		{"maxCost: another currency is refused", []Bid{p("did:a", 1)}, nil, nil, capped(20, "EUR"), "", 1},
		{"maxCost 0: only free bids", []Bid{p("did:a", 1), {URI: "u", Bidder: "did:z", Free: true}}, nil, nil, capped(0, "USD"), "did:z", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, ref := Choose(c.bids, Size{}, c.allow, c.deny, c.policy, OfferingRule{})
			got := ""
			if w != nil {
				got = w.Bidder
			}
			if got != c.want || len(ref) != c.refused {
				t.Fatalf("winner %q refused %v; want %q and %d refused", got, ref, c.want, c.refused)
			}
		})
	}
}

func capped(max int64, currency string) Policy {
	return Policy{NSID: PolicyOpen, PriceCap: PriceCap{Set: true, Max: max, Currency: currency}}
}

func TestPriceCapArg(t *testing.T) {
	for _, c := range []struct {
		args    map[string]string
		want    PriceCap
		wantErr bool
	}{
		{nil, PriceCap{}, false},
		{map[string]string{ArgMaxCost: ""}, PriceCap{}, false},
		{map[string]string{ArgMaxCost: "5", ArgCurrency: "USD"}, PriceCap{Set: true, Max: 5, Currency: "USD"}, false},
		{map[string]string{ArgMaxCost: "0", ArgCurrency: " USD "}, PriceCap{Set: true, Currency: "USD"}, false},
		{map[string]string{ArgMaxCost: "5"}, PriceCap{}, true},
		{map[string]string{ArgMaxCost: "-1", ArgCurrency: "USD"}, PriceCap{}, true},
		{map[string]string{ArgMaxCost: "1.5", ArgCurrency: "USD"}, PriceCap{}, true},
	} {
		got, err := PriceCapArg(c.args)
		if got != c.want || (err != nil) != c.wantErr {
			t.Errorf("PriceCapArg(%v) = %+v, %v; want %+v, error %v", c.args, got, err, c.want, c.wantErr)
		}
	}
}

func TestBinds(t *testing.T) {
	acc := Ref{URI: "at://did:r/accept/1", CID: "bafyA"}
	good := ReceiptSeen{Author: "did:w", Accept: acc, AcceptCID: "bafyA"}
	if err := Binds(good, acc, "did:w"); err != nil {
		t.Fatal(err)
	}
	bad := map[string]ReceiptSeen{
		"other author": {Author: "did:x", Accept: acc, AcceptCID: "bafyA"},
		"other accept": {Author: "did:w", Accept: Ref{URI: "at://did:r/accept/2", CID: "bafyA"}, AcceptCID: "bafyA"},
		"other cid":    {Author: "did:w", Accept: acc, AcceptCID: "bafyB"},
		"stale ref":    {Author: "did:w", Accept: Ref{URI: acc.URI, CID: "bafyOld"}, AcceptCID: "bafyA"},
	}
	for name, r := range bad {
		if Binds(r, acc, "did:w") == nil {
			t.Errorf("%s: bound", name)
		}
	}
}

func TestPolicy(t *testing.T) {
	for _, c := range []struct {
		name  string
		p     Policy
		c     Candidate
		allow bool
	}{
		{"open", Policy{NSID: PolicyOpen}, Candidate{Bidder: "did:a"}, true},
		{"onlyMe me", Policy{NSID: PolicyOnlyMe, RequesterDID: "did:me"}, Candidate{Bidder: "did:me"}, true},
		{"onlyMe other", Policy{NSID: PolicyOnlyMe, RequesterDID: "did:me"}, Candidate{Bidder: "did:a"}, false},
		{"onlyMe without requester", Policy{NSID: PolicyOnlyMe}, Candidate{Bidder: ""}, false},
		{"unknown", Policy{NSID: "x.y.z"}, Candidate{}, false},
		{"error", Policy{NSID: PolicyOpen, Err: errors.New("unreadable")}, Candidate{}, false},
		{"cpu bound ok", Policy{NSID: PolicyOpen, MaxCPUs: 2}, Candidate{CPUs: 2}, true},
		{"cpu bound over", Policy{NSID: PolicyOpen, MaxCPUs: 2}, Candidate{CPUs: 3}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.p.Allows(c.c); (err == nil) != c.allow {
				t.Fatalf("allows=%v (%v), want %v", err == nil, err, c.allow)
			}
		})
	}
	for in, want := range map[string]string{"": PolicyOpen, "open": PolicyOpen, "only_me": PolicyOnlyMe} {
		if got, err := PolicyName(in); err != nil || got != want {
			t.Errorf("PolicyName(%q) = %q %v", in, got, err)
		}
	}
	if _, err := PolicyName("cheapest"); err == nil {
		t.Error("unknown policy name accepted")
	}
}

func TestNext(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const (
		req  = v1alpha1.ComputeContractRequesting
		held = v1alpha1.ComputeContractHeld
		rel  = v1alpha1.ComputeContractReleasing
		done = v1alpha1.ComputeContractReleased
		fl   = v1alpha1.ComputeContractFailed
	)
	base := func() State {
		return State{Now: t0, Phase: req, RFPAt: t0, Window: 10 * time.Second, AnswerWait: 20 * time.Second,
			ReadyTimeout: 30 * time.Second, Bidders: []string{"did:a", "did:b"}, Policy: Policy{NSID: PolicyOpen}}
	}
	bid := func(d string, c int64) Bid { return Bid{URI: "at://" + d + "/b", Bidder: d, Cost: c, Currency: "USD"} }
	acc := Ref{URI: "at://did:r/accept/1", CID: "bafyA"}
	receipt := &ReceiptSeen{Author: "did:a"}
	won := func(mod func(*State)) State {
		s := base()
		s.Accept, s.Winner, s.AcceptAt, s.Receipt = acc, "did:a", t0, receipt
		mod(&s)
		return s
	}
	for _, c := range []struct {
		name   string
		s      State
		act    Action
		phase  v1alpha1.ComputeContractPhase
		reason string
		wait   time.Duration
	}{
		{"pending writes rfp", func() State { s := base(); s.Phase, s.RFPAt = v1alpha1.ComputeContractPending, time.Time{}; return s }(), ActRFP, req, "", 0},
		{"window open", base(), ActNone, req, "", 10 * time.Second},
		{"early close accepts cheapest", func() State { s := base(); s.Bids = []Bid{bid("did:a", 5), bid("did:b", 3)}; return s }(), ActAccept, req, "", 20 * time.Second},
		{"no bids", func() State { s := base(); s.Now = t0.Add(10 * time.Second); return s }(), ActNone, fl, ReasonNoBids, 0},
		{"no bids in a window opened before the requester started: rfp again", func() State {
			s := base()
			s.Now, s.WatchingSince = t0.Add(10*time.Second), t0.Add(time.Second)
			return s
		}(), ActRFPAgain, req, "", 10 * time.Second},
		{"no bids in a window the requester watched whole fails", func() State {
			s := base()
			s.Now, s.WatchingSince = t0.Add(10*time.Second), t0
			return s
		}(), ActNone, fl, ReasonNoBids, 0},
		{"no bids in the window written again fails", func() State {
			s := base()
			s.Now, s.WatchingSince, s.RFPAgain = t0.Add(10*time.Second), t0.Add(time.Second), true
			return s
		}(), ActNone, fl, ReasonNoBids, 0},
		{"bids in a window opened before the requester started: accepted", func() State {
			s := base()
			s.Now, s.WatchingSince, s.Bids = t0.Add(10*time.Second), t0.Add(time.Second), []Bid{bid("did:a", 5)}
			return s
		}(), ActAccept, req, "", 20 * time.Second},
		{"all refused", func() State {
			s := base()
			s.Now, s.Policy, s.Bids = t0.Add(10*time.Second), Policy{NSID: PolicyOnlyMe, RequesterDID: "did:me"}, []Bid{bid("did:a", 1)}
			return s
		}(), ActNone, fl, ReasonAllRefused, 0},
		{"waiting for receipt", func() State { s := won(func(s *State) { s.Receipt = nil }); s.Now = t0.Add(5 * time.Second); return s }(), ActNone, req, "", 15 * time.Second},
		{"winner silent", won(func(s *State) { s.Receipt, s.Now = nil, t0.Add(20*time.Second) }), ActNone, fl, ReasonWinnerSilent, 0},
		{"waiting for started", won(func(s *State) { s.Now = t0.Add(time.Second) }), ActNone, req, "", 29 * time.Second},
		{"held", won(func(s *State) { s.Started = true }), ActNone, held, "Started", 0},
		{"ready timeout releases", won(func(s *State) { s.Now = t0.Add(30 * time.Second) }), ActDelete, fl, ReasonVMReadyTimeout, 0},
		{"secrets: deliver once the receipt binds", won(func(s *State) { s.SecretsWanted, s.Now = true, t0.Add(time.Second) }), ActDeliverSecrets, req, "", time.Second},
		{"secrets: delivery retried until the deadline", won(func(s *State) { s.SecretsWanted, s.Now = true, t0.Add(29900*time.Millisecond) }), ActDeliverSecrets, req, "", 100 * time.Millisecond},
		{"secrets: not Held on vm.started before delivery", won(func(s *State) { s.SecretsWanted, s.Started = true, true }), ActDeliverSecrets, req, "", time.Second},
		{"secrets: delivered and started is Held", won(func(s *State) { s.SecretsWanted, s.SecretsDelivered, s.Started = true, true, true }), ActNone, held, "Started", 0},
		{"secrets: delivered, waiting for started", won(func(s *State) { s.SecretsWanted, s.SecretsDelivered, s.Now = true, true, t0.Add(time.Second) }), ActNone, req, "", 29 * time.Second},
		{"secrets: undelivered at the deadline releases", won(func(s *State) { s.SecretsWanted, s.Now = true, t0.Add(30*time.Second) }), ActDelete, fl, ReasonSecretsUndelivered, 0},
		{"secrets: a guest that ended is not waited for", won(func(s *State) { s.SecretsWanted, s.Ended = true, true }), ActNone, done, "GuestEnded", 0},
		{"ended by itself", won(func(s *State) { s.Started, s.Ended = true, true }), ActNone, done, "GuestEnded", 0},
		{"release writes delete", won(func(s *State) { s.Phase, s.Started, s.Release = held, true, true }), ActDelete, rel, "", 20 * time.Second},
		{"release waits", won(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Now = rel, true, t0, t0.Add(time.Second) }), ActNone, rel, "", 19 * time.Second},
		{"released", won(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Ended = rel, true, t0, true }), ActNone, done, "Released", 0},
		{"bidder lost", won(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Now = rel, true, t0, t0.Add(20*time.Second) }), ActNone, fl, ReasonBidderLost, 0},
		{"release before accept", func() State { s := base(); s.Release = true; return s }(), ActNone, done, "NothingHeld", 0},
		{"release waits for receipt", won(func(s *State) { s.Release, s.Receipt, s.ReleaseAt = true, nil, t0 }), ActNone, rel, "", 20 * time.Second},
		{"final stays", won(func(s *State) { s.Phase = fl }), ActNone, fl, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Next(c.s)
			if d.Action != c.act || d.Phase != c.phase || d.Reason != c.reason || d.RequeueAfter != c.wait {
				t.Fatalf("got %+v; want action %q phase %s reason %q wait %s", d, c.act, c.phase, c.reason, c.wait)
			}
			if d.Phase == fl && d.Reason != "" && !strings.HasPrefix(d.Message, d.Reason+": ") {
				t.Fatalf("message %q does not name the reason", d.Message)
			}
		})
	}
}

func TestSecondsArg(t *testing.T) {
	if d, err := SecondsArg(map[string]string{"x": "0.5"}, "x", time.Hour); err != nil || d != 500*time.Millisecond {
		t.Fatal(d, err)
	}
	if d, _ := SecondsArg(nil, "x", time.Hour); d != time.Hour {
		t.Fatal(d)
	}
	if _, err := SecondsArg(map[string]string{"x": "-1"}, "x", 0); err == nil {
		t.Fatal("negative accepted")
	}
}

func TestOrigin(t *testing.T) {
	sec := time.Date(2026, 11, 30, 12, 0, 7, 0, time.UTC)
	tests := []struct {
		name string
		in   time.Time
		want time.Time
	}{
		{"zero stays zero", time.Time{}, time.Time{}},
		{"a whole second (read back from the API) counts from its end", sec, sec.Add(time.Second)},
		{"a finer time counts from the end of its second", sec.Add(900 * time.Millisecond), sec.Add(time.Second)},
		{"just after a second", sec.Add(time.Nanosecond), sec.Add(time.Second)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Origin(tc.in); !got.Equal(tc.want) {
				t.Errorf("Origin(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
	// Whatever the true time in the second the API kept, a deadline from Origin is never early.
	for ns := time.Duration(0); ns < time.Second; ns += 97 * time.Millisecond {
		truth := sec.Add(ns)
		kept := truth.Truncate(time.Second) // what a metav1.Time round trip keeps
		if dl := Origin(kept).Add(3 * time.Second); dl.Before(truth.Add(3*time.Second)) || dl.After(truth.Add(4*time.Second)) {
			t.Errorf("event at %s: deadline %s is not within [3s, 4s] after it", truth, dl)
		}
	}
}

// A guest that ended by itself is reported with the winner's stated reason, quoted and
// bounded: the words are a peer's.
func TestNextRepeatsTheWinnersReason(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, c := range []struct{ name, reason, want string }{
		{"no reason", "", "the guest ended by itself and did:a reported it"},
		{"a reason", "boot: disk full", `the guest ended by itself and did:a reported it: "boot: disk full"`},
		{"control characters", "a\nb\x1b[31m", `the guest ended by itself and did:a reported it: "a\nb\x1b[31m"`},
		{"too long", strings.Repeat("x", 300), `the guest ended by itself and did:a reported it: "` + strings.Repeat("x", 256) + `..."`},
		{"cut inside a rune", strings.Repeat("x", 255) + "é", `the guest ended by itself and did:a reported it: "` + strings.Repeat("x", 255) + `..."`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := State{Now: t0, Phase: v1alpha1.ComputeContractRequesting, RFPAt: t0, AcceptAt: t0, Winner: "did:a",
				Accept: Ref{URI: "at://did:r/accept/1", CID: "bafyA"}, Receipt: &ReceiptSeen{Author: "did:a"},
				Window: 10 * time.Second, AnswerWait: 20 * time.Second, ReadyTimeout: 30 * time.Second,
				Started: true, Ended: true, EndedReason: c.reason, Policy: Policy{NSID: PolicyOpen}}
			d := Next(s)
			if d.Phase != v1alpha1.ComputeContractReleased || d.Message != c.want {
				t.Errorf("%s %q, want Released %q", d.Phase, d.Message, c.want)
			}
		})
	}
}
