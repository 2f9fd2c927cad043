package market

import (
	"slices"
	"strings"
	"testing"
	"time"

	"socialweb.computer/api/v1alpha1"
)

func TestBoundaryAtLeast(t *testing.T) {
	for _, c := range []struct {
		got, req Boundary
		want     bool
	}{
		{BoundaryVM, BoundaryVM, true},
		{BoundaryVM, BoundaryNamespace, true},
		{BoundaryNamespace, BoundaryNamespace, true},
		{BoundaryNamespace, BoundaryVM, false},
		{BoundaryProcess, BoundaryNamespace, false},
		{BoundaryProcess, BoundaryVM, false},
		{BoundaryNone, BoundaryNamespace, false},
		{BoundaryNone, BoundaryVM, false},
		{"hypervisor-ish", BoundaryNamespace, false}, // an unknown value says nothing we rely on
		{BoundaryNone, BoundaryNone, true},
		{BoundaryProcess, BoundaryNone, true},
	} {
		if got := c.got.AtLeast(c.req); got != c.want {
			t.Errorf("%q.AtLeast(%q) = %v, want %v", c.got, c.req, got, c.want)
		}
	}
}

func TestParseRequirement(t *testing.T) {
	for in, want := range map[string]Boundary{"": BoundaryNone, "vm": BoundaryVM, "namespace": BoundaryNamespace, " vm ": BoundaryVM} {
		if got, err := ParseRequirement(in); err != nil || got != want {
			t.Errorf("ParseRequirement(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"process", "VM", "kvm", "none"} {
		if _, err := ParseRequirement(in); err == nil {
			t.Errorf("ParseRequirement(%q) accepted", in)
		}
	}
}

func TestStatedBoundary(t *testing.T) {
	entries := []Isolation{
		{Substrate: "deno", Boundary: BoundaryProcess},
		{Substrate: "node", Boundary: BoundaryVM},
		{Substrate: "node", Boundary: BoundaryNamespace},
		{Substrate: "vm", Boundary: BoundaryVM},
	}
	for kind, want := range map[string]Boundary{"deno": BoundaryProcess, "node": BoundaryNamespace, "vm": BoundaryVM, "other": BoundaryNone} {
		if got := StatedBoundary(entries, kind); got != want {
			t.Errorf("%s: got %q, want %q", kind, got, want)
		}
	}
	if got := StatedBoundary(nil, "deno"); got != BoundaryNone {
		t.Errorf("no entries: got %q", got)
	}
}

func TestBiddersIsolation(t *testing.T) {
	stated := map[string]Boundary{"did:vm": BoundaryVM, "did:ns": BoundaryNamespace, "did:proc": BoundaryProcess}
	all := []string{"did:vm", "did:ns", "did:proc", "did:silent"}
	for _, c := range []struct {
		name    string
		require Boundary
		allow   []string
		want    []string
	}{
		{"no requirement waits for all", BoundaryNone, nil, []string{"did:ns", "did:proc", "did:silent", "did:vm"}},
		{"namespace", BoundaryNamespace, nil, []string{"did:ns", "did:vm"}},
		{"vm", BoundaryVM, nil, []string{"did:vm"}},
		{"bidderDids are filtered too", BoundaryVM, []string{"did:ns", "did:vm"}, []string{"did:vm"}},
		{"none left", BoundaryVM, []string{"did:proc"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			rule := OfferingRule{Require: c.require, Kind: "deno", Stated: stated}
			if got := Bidders(all, c.allow, nil, rule); !slices.Equal(got, c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

func TestChooseIsolation(t *testing.T) {
	open := Policy{NSID: PolicyOpen}
	free := func(bidder string) Bid { return Bid{URI: "at://" + bidder + "/bid/1", Bidder: bidder, Free: true} }
	stated := map[string]Boundary{"did:a-proc": BoundaryProcess, "did:b-ns": BoundaryNamespace, "did:c-vm": BoundaryVM}
	bids := []Bid{free("did:a-proc"), free("did:b-ns"), free("did:c-vm"), free("did:d-silent")}
	for _, c := range []struct {
		name    string
		require Boundary
		want    string
		refused []string
	}{
		{"no requirement: the smallest DID of equal price", BoundaryNone, "did:a-proc", nil},
		{"namespace refuses process and silent", BoundaryNamespace, "did:b-ns", []string{"did:a-proc", "did:d-silent"}},
		{"vm refuses all but vm", BoundaryVM, "did:c-vm", []string{"did:a-proc", "did:b-ns", "did:d-silent"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, ref := Choose(bids, Size{}, nil, nil, open, OfferingRule{Require: c.require, Kind: "deno", Stated: stated})
			got := ""
			if w != nil {
				got = w.Bidder
			}
			if got != c.want {
				t.Fatalf("winner %q, want %q (refused %v)", got, c.want, ref)
			}
			var who []string
			for _, r := range ref {
				who = append(who, r.Bid.Bidder)
				if !strings.Contains(r.Reason, "requireIsolation "+string(c.require)) || !strings.Contains(r.Reason, "deno") {
					t.Errorf("reason %q does not name the requirement and kind", r.Reason)
				}
			}
			slices.Sort(who)
			if !slices.Equal(who, c.refused) {
				t.Fatalf("refused %v, want %v", who, c.refused)
			}
		})
	}
}

func TestNextIsolation(t *testing.T) {
	t0 := time.Unix(1000, 0)
	base := State{
		Phase: v1alpha1.ComputeContractRequesting, RFPAt: t0, Window: 5 * time.Second, AnswerWait: time.Minute, ReadyTimeout: time.Minute,
		Policy: Policy{NSID: PolicyOpen},
	}
	rule := OfferingRule{Require: BoundaryVM, Kind: "deno", Stated: map[string]Boundary{"did:deno": BoundaryProcess}}

	// The only bidder states less than vm: it is not waited for, so the window runs to its
	// deadline although it bid, and the message says no known bidder meets the requirement.
	s := base
	s.Now, s.Offering = t0.Add(time.Second), rule
	s.Bidders = Bidders([]string{"did:deno"}, nil, nil, rule)
	s.Bids = []Bid{{URI: "at://did:deno/bid/1", Bidder: "did:deno", Free: true}}
	d := Next(s)
	if d.Phase != v1alpha1.ComputeContractRequesting || d.Action != ActNone || d.RequeueAfter != 4*time.Second {
		t.Fatalf("in the window: %+v", d)
	}
	if !strings.Contains(d.Message, "requireIsolation vm") {
		t.Fatalf("waiting message %q does not name the requirement", d.Message)
	}
	// At the deadline its bid is refused: AllRefused naming the requirement.
	s.Now = t0.Add(5 * time.Second)
	d = Next(s)
	if d.Phase != v1alpha1.ComputeContractFailed || d.Reason != ReasonAllRefused || !strings.Contains(d.Message, "requireIsolation vm") {
		t.Fatalf("at the deadline: %+v", d)
	}
	// No bid at all: NoBids names the requirement too.
	s.Bids = nil
	d = Next(s)
	if d.Reason != ReasonNoBids || !strings.Contains(d.Message, "requireIsolation vm") {
		t.Fatalf("no bids: %+v", d)
	}
	// Without the requirement the same bid wins.
	s = base
	s.Now = t0.Add(time.Second)
	s.Bidders = Bidders([]string{"did:deno"}, nil, nil, OfferingRule{})
	s.Bids = []Bid{{URI: "at://did:deno/bid/1", Bidder: "did:deno", Free: true}}
	d = Next(s)
	if d.Action != ActAccept || d.Winner == nil || d.Winner.Bidder != "did:deno" {
		t.Fatalf("without the requirement: %+v", d)
	}
}

func TestStatedLayers(t *testing.T) {
	entries := []Isolation{
		{Substrate: "node", Boundary: BoundaryNamespace, Layers: []string{"seccomp", "pod-user-namespaces"}},
		{Substrate: "node", Boundary: BoundaryVM, Layers: []string{"kvm", "seccomp"}},
		{Substrate: "deno", Boundary: BoundaryNamespace, Layers: []string{"deno-permissions"}},
	}
	if got := StatedLayers(entries, "node"); !slices.Equal(got, []string{"seccomp"}) {
		t.Errorf("two node entries: %v, want only what both state", got)
	}
	if got := StatedLayers(entries, "deno"); !slices.Equal(got, []string{"deno-permissions"}) {
		t.Errorf("deno: %v", got)
	}
	if got := StatedLayers(entries, "vm"); got != nil {
		t.Errorf("no entry: %v", got)
	}
}

// A contract requiring a layer waits only for bidders whose offering states it, and refuses
// the bids of the others, naming the layer they lack.
func TestLayersRule(t *testing.T) {
	layers := map[string][]string{
		"did:b-userns": {"seccomp", "pod-user-namespaces"},
		"did:a-plain":  {"seccomp"},
	}
	rule := OfferingRule{Layers: []string{"pod-user-namespaces"}, Kind: "node", StatedLayers: layers}
	if got := Bidders([]string{"did:b-userns", "did:a-plain", "did:c-silent"}, nil, nil, rule); !slices.Equal(got, []string{"did:b-userns"}) {
		t.Fatalf("bidders waited for: %v", got)
	}
	free := func(bidder string) Bid { return Bid{URI: "at://" + bidder + "/bid/1", Bidder: bidder, Free: true} }
	// The plain bidder's DID sorts first: without the rule it would win.
	w, refused := Choose([]Bid{free("did:b-userns"), free("did:a-plain")}, Size{}, nil, nil, Policy{NSID: PolicyOpen}, OfferingRule{Kind: "node"})
	if w == nil || w.Bidder != "did:a-plain" || len(refused) != 0 {
		t.Fatalf("without the rule: %v %v", w, refused)
	}
	w, refused = Choose([]Bid{free("did:a-plain"), free("did:b-userns")}, Size{}, nil, nil, Policy{NSID: PolicyOpen}, rule)
	if w == nil || w.Bidder != "did:b-userns" {
		t.Fatalf("winner %v, want did:b-userns", w)
	}
	if len(refused) != 1 || refused[0].Bid.Bidder != "did:a-plain" || !strings.Contains(refused[0].Reason, "does not state pod-user-namespaces for node guests") {
		t.Fatalf("refused %+v", refused)
	}
	both := OfferingRule{Require: BoundaryVM, Layers: []string{"kvm"}, Kind: "node"}
	if got := both.String(); got != "requireIsolation vm, requireLayers kvm" {
		t.Errorf("String() = %q", got)
	}
	if (OfferingRule{}).Requires() || !rule.Requires() {
		t.Error("Requires")
	}
}
