package market

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"socialweb.computer/api/v1alpha1"
)

// TestStateOf walks the market flow: each row a situation the requester meets, the stage it
// is in and what Next decides there.
func TestStateOf(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const (
		pend = v1alpha1.ComputeContractPending
		req  = v1alpha1.ComputeContractRequesting
		held = v1alpha1.ComputeContractHeld
		rel  = v1alpha1.ComputeContractReleasing
		done = v1alpha1.ComputeContractReleased
		fl   = v1alpha1.ComputeContractFailed
	)
	published := func(mod func(*State)) State {
		s := State{Now: t0, Phase: req, RFPAt: t0, Window: 10 * time.Second, AnswerWait: 20 * time.Second,
			ReadyTimeout: 30 * time.Second, Bidders: []string{"did:a", "did:b"}, Policy: Policy{NSID: PolicyOpen}}
		mod(&s)
		return s
	}
	bid := func(d string, c int64) Bid { return Bid{URI: "at://" + d + "/b", Bidder: d, Cost: c, Currency: "USD"} }
	accepted := func(mod func(*State)) State {
		return published(func(s *State) {
			s.Accept, s.Winner, s.AcceptAt = Ref{URI: "at://did:r/accept/1", CID: "bafyA"}, "did:a", t0
			mod(s)
		})
	}
	bound := func(mod func(*State)) State {
		return accepted(func(s *State) {
			s.Receipt = &ReceiptSeen{Author: "did:a"}
			mod(s)
		})
	}
	for _, c := range []struct {
		name   string
		s      State
		stage  Stage
		act    Action
		phase  v1alpha1.ComputeContractPhase
		reason string
	}{
		{"nothing published", published(func(s *State) { s.Phase, s.RFPAt = pend, time.Time{} }), StageUnpublished, ActRFP, req, ""},
		{"rfp out, window open", published(func(s *State) { s.Bids = []Bid{bid("did:a", 5)} }), StageBidding, ActNone, req, ""},
		{"window closed with bids", published(func(s *State) { s.Now, s.Bids = t0.Add(10*time.Second), []Bid{bid("did:a", 5)} }), StageBidding, ActAccept, req, ""},
		{"every bidder answered", published(func(s *State) { s.Bids = []Bid{bid("did:a", 5), bid("did:b", 3)} }), StageBidding, ActAccept, req, ""},
		{"window closed without bids", published(func(s *State) { s.Now = t0.Add(10 * time.Second) }), StageBidding, ActNone, fl, ReasonNoBids},
		{"accepted, awaiting receipt", accepted(func(s *State) { s.Now = t0.Add(time.Second) }), StageAccepted, ActNone, req, ""},
		{"accepted, winner silent", accepted(func(s *State) { s.Now = t0.Add(20 * time.Second) }), StageAccepted, ActNone, fl, ReasonWinnerSilent},
		{"receipt held, waiting for vm.started", bound(func(s *State) {}), StageBound, ActNone, req, ""},
		{"receipt held, secrets to deliver", bound(func(s *State) { s.SecretsWanted = true }), StageBound, ActDeliverSecrets, req, ""},
		{"receipt held, guest started", bound(func(s *State) { s.Started = true }), StageBound, ActNone, held, "Started"},
		{"receipt held, ready timeout", bound(func(s *State) { s.Now = t0.Add(30 * time.Second) }), StageBound, ActDelete, fl, ReasonVMReadyTimeout},
		{"receipt held, guest ended", bound(func(s *State) { s.Started, s.Ended = true, true }), StageBound, ActNone, done, "GuestEnded"},
		{"release asked before any rfp", published(func(s *State) { s.Phase, s.RFPAt, s.Release = pend, time.Time{}, true }), StageReleasing, ActNone, done, "NothingHeld"},
		{"release asked while bidding", published(func(s *State) { s.Release = true }), StageReleasing, ActNone, done, "NothingHeld"},
		{"release asked, receipt awaited", accepted(func(s *State) { s.Release, s.ReleaseAt = true, t0 }), StageReleasing, ActNone, rel, ""},
		{"release asked, receipt held", bound(func(s *State) { s.Phase, s.Started, s.Release = held, true, true }), StageReleasing, ActDelete, rel, ""},
		{"release asked, delete written", bound(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Now = rel, true, t0, t0.Add(time.Second) }), StageReleasing, ActNone, rel, ""},
		{"release answered", bound(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Ended = rel, true, t0, true }), StageReleasing, ActNone, done, "Released"},
		{"bidder lost after the delete", bound(func(s *State) { s.Phase, s.Release, s.DeleteAt, s.Now = rel, true, t0, t0.Add(20*time.Second) }), StageReleasing, ActNone, fl, ReasonBidderLost},
		{"bidder lost before its receipt", accepted(func(s *State) { s.Release, s.ReleaseAt, s.Now = true, t0, t0.Add(20*time.Second) }), StageReleasing, ActNone, fl, ReasonBidderLost},
		{"released stays", bound(func(s *State) { s.Phase, s.Release = done, true }), StageFinal, ActNone, done, ""},
		{"failed stays", published(func(s *State) { s.Phase = fl }), StageFinal, ActNone, fl, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := StateOf(c.s); got != c.stage {
				t.Fatalf("stage %s, want %s", got, c.stage)
			}
			d := Next(c.s)
			if d.Action != c.act || d.Phase != c.phase || d.Reason != c.reason {
				t.Fatalf("in %s: got %+v; want action %q phase %s reason %q", c.stage, d, c.act, c.phase, c.reason)
			}
		})
	}
}

// TestStateOfHoldsEveryAction: the requester runs one step per stage, so each action Next
// asks for must come only in the stage whose step writes it. Random states, seeded.
func TestStateOfHoldsEveryAction(t *testing.T) {
	writes := map[Action][]Stage{
		ActRFP:            {StageUnpublished},
		ActAccept:         {StageBidding},
		ActRFPAgain:       {StageBidding},
		ActDeliverSecrets: {StageBound},
		ActDelete:         {StageBound, StageReleasing},
	}
	t0 := time.Unix(1000, 0)
	rng := rand.New(rand.NewPCG(1, 2))
	phases := []Phase{"", v1alpha1.ComputeContractPending, v1alpha1.ComputeContractRequesting, v1alpha1.ComputeContractHeld,
		v1alpha1.ComputeContractReleasing, v1alpha1.ComputeContractReleased, v1alpha1.ComputeContractFailed}
	at := func() time.Time {
		if rng.IntN(3) == 0 {
			return time.Time{}
		}
		return t0.Add(time.Duration(rng.IntN(40)) * time.Second)
	}
	seen := map[Action]int{}
	for i := 0; i < 20000; i++ {
		s := State{Now: t0.Add(time.Duration(rng.IntN(60)) * time.Second), Phase: phases[rng.IntN(len(phases))],
			Release: rng.IntN(3) == 0, RFPAt: at(), Window: 10 * time.Second, AnswerWait: 20 * time.Second,
			ReadyTimeout: 30 * time.Second, Bidders: []string{"did:a", "did:b"}, Policy: Policy{NSID: PolicyOpen},
			AcceptAt: at(), DeleteAt: at(), ReleaseAt: at(), Started: rng.IntN(2) == 0, Ended: rng.IntN(4) == 0,
			SecretsWanted: rng.IntN(2) == 0, SecretsDelivered: rng.IntN(2) == 0}
		for _, d := range []string{"did:a", "did:b"}[:rng.IntN(3)] {
			s.Bids = append(s.Bids, Bid{URI: "at://" + d + "/b", Bidder: d, Cost: int64(rng.IntN(5)), Currency: "USD"})
		}
		if rng.IntN(2) == 0 {
			s.Accept, s.Winner = Ref{URI: "at://did:r/accept/1", CID: "bafyA"}, "did:a"
			if rng.IntN(2) == 0 {
				s.Receipt = &ReceiptSeen{Author: "did:a"}
			}
		}
		s.WatchingSince, s.RFPAgain = at(), rng.IntN(2) == 0
		d, stage := Next(s), StateOf(s)
		if d.Action == ActNone {
			continue
		}
		seen[d.Action]++
		if !slices.Contains(writes[d.Action], stage) {
			t.Fatalf("%+v: action %q in stage %s, whose step does not write it", s, d.Action, stage)
		}
	}
	for a := range writes {
		if seen[a] == 0 {
			t.Errorf("no state asked for %q: the generator misses it", a)
		}
	}
}
