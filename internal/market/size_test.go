package market

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"socialweb.computer/api/v1alpha1"
)

func TestPricingPrice(t *testing.T) {
	for _, c := range []struct {
		name     string
		pricing  Pricing
		size     Size
		want     int64
		overflow bool
		err      string // a part of the error's message; "" with !overflow: no error
	}{
		{"all zero is zero", Pricing{}, Size{1, 256}, 0, false, ""},
		{"base only", Pricing{Base: 7}, Size{4, 8192}, 7, false, ""},
		{"per CPU", Pricing{PerCPU: 3}, Size{4, 256}, 12, false, ""},
		{"a whole GiB", Pricing{PerGiB: 10}, Size{1, 1024}, 10, false, ""},
		{"part of a GiB rounds up", Pricing{PerGiB: 10}, Size{1, 256}, 3, false, ""},
		{"one MiB costs its part, not nothing", Pricing{PerGiB: 1}, Size{1, 1}, 1, false, ""},
		{"exact quarter", Pricing{PerGiB: 4}, Size{1, 256}, 1, false, ""},
		{"all parts", Pricing{Base: 100, PerCPU: 20, PerGiB: 8}, Size{2, 1536}, 100 + 40 + 12, false, ""},
		{"at the largest cost", Pricing{Base: math.MaxInt64}, Size{1, 1}, math.MaxInt64, false, ""},
		{"CPUs overflow", Pricing{PerCPU: math.MaxInt64 / 2}, Size{3, 1}, 0, true, "per CPU"},
		{"memory product overflows", Pricing{PerGiB: math.MaxInt64 / 1000}, Size{1, 1 << 20}, 0, true, "per GiB"},
		{"sum overflows", Pricing{Base: math.MaxInt64, PerCPU: 1}, Size{1, 1}, 0, true, "cost"},
		{"sum with memory overflows", Pricing{Base: math.MaxInt64 - 1, PerGiB: 2048}, Size{1, 1024}, 0, true, "2048 for the memory"},
		{"huge asked size", Pricing{PerCPU: 1 << 40, PerGiB: 1 << 40}, Size{1024, math.MaxInt64}, 0, true, "per GiB"},
		{"negative base", Pricing{Base: -1}, Size{1, 256}, 0, false, "negative"},
		{"negative per GiB", Pricing{PerGiB: -1}, Size{1, 256}, 0, false, "negative"},
		{"no CPUs", Pricing{PerCPU: 1}, Size{0, 256}, 0, false, "no price"},
		{"negative memory", Pricing{PerGiB: 1}, Size{1, -1024}, 0, false, "no price"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.pricing.Price(c.size)
			if c.err == "" {
				if err != nil || got != c.want {
					t.Fatalf("Price = %d, %v; want %d", got, err, c.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Price = %d, want an error with %q", got, c.err)
			}
			if errors.Is(err, ErrPriceOverflow) != c.overflow || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %q: want overflow %v and %q in it", err, c.overflow, c.err)
			}
		})
	}
}

func TestSizeString(t *testing.T) {
	for s, want := range map[Size]string{
		{1, 256}:  "1 CPU, 256 MiB",
		{2, 512}:  "2 CPUs, 512 MiB",
		{0, 0}:    "0 CPUs, 0 MiB",
		{16, 1e6}: "16 CPUs, 1000000 MiB",
	} {
		if got := s.String(); got != want {
			t.Errorf("%#v = %q, want %q", s, got, want)
		}
	}
}

func TestChooseSize(t *testing.T) {
	open := Policy{NSID: PolicyOpen}
	asked := Size{2, 512}
	priced := func(bidder string, cost int64, size *Size) Bid {
		return Bid{URI: "at://" + bidder + "/bid/1", Bidder: bidder, Cost: cost, Currency: "USD", Size: size}
	}
	for _, c := range []struct {
		name    string
		asked   Size
		bids    []Bid
		want    string
		refused []Refusal
	}{
		{"exactly the size asked", asked, []Bid{priced("did:a", 5, &Size{2, 512})}, "did:a", nil},
		{"no size stated is the size asked", asked, []Bid{priced("did:a", 5, nil)}, "did:a", nil},
		{"larger fits", asked, []Bid{priced("did:a", 5, &Size{4, 1024})}, "did:a", nil},
		{"fewer CPUs refused", asked, []Bid{priced("did:a", 5, &Size{1, 512})}, "",
			[]Refusal{{priced("did:a", 5, &Size{1, 512}), "the bid is for 1 CPU, 512 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"less memory refused", asked, []Bid{priced("did:a", 5, &Size{2, 256})}, "",
			[]Refusal{{priced("did:a", 5, &Size{2, 256}), "the bid is for 2 CPUs, 256 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"both smaller refused", asked, []Bid{priced("did:a", 5, &Size{1, 256})}, "",
			[]Refusal{{priced("did:a", 5, &Size{1, 256}), "the bid is for 1 CPU, 256 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"zero size stated refused", asked, []Bid{priced("did:a", 5, &Size{})}, "",
			[]Refusal{{priced("did:a", 5, &Size{}), "the bid is for 0 CPUs, 0 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"the cheapest that fits wins over a cheaper too small", asked,
			[]Bid{priced("did:a", 1, &Size{1, 256}), priced("did:b", 9, &Size{2, 512}), priced("did:c", 7, &Size{2, 1024})}, "did:c",
			[]Refusal{{priced("did:a", 1, &Size{1, 256}), "the bid is for 1 CPU, 256 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"a free bid too small is refused too", asked,
			[]Bid{{URI: "u", Bidder: "did:z", Free: true, Size: &Size{1, 512}}, priced("did:b", 9, nil)}, "did:b",
			[]Refusal{{Bid{URI: "u", Bidder: "did:z", Free: true, Size: &Size{1, 512}}, "the bid is for 1 CPU, 512 MiB; the rfp asks 2 CPUs, 512 MiB"}}},
		{"asked not known: no bid is too small", Size{}, []Bid{priced("did:a", 5, &Size{1, 1})}, "did:a", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, refused := Choose(c.bids, c.asked, nil, nil, open, OfferingRule{})
			got := ""
			if w != nil {
				got = w.Bidder
			}
			if got != c.want {
				t.Fatalf("winner %q, want %q (refused %v)", got, c.want, refused)
			}
			if d := cmp.Diff(c.refused, refused); d != "" {
				t.Fatalf("refused (-want +got):\n%s", d)
			}
		})
	}
}

// TestNextSize: a window whose every bid is for less than the rfp asks fails AllRefused,
// the message naming both sizes.
func TestNextSize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := State{Now: t0.Add(time.Minute), Phase: v1alpha1.ComputeContractRequesting, RFPAt: t0, Window: time.Second,
		Policy: Policy{NSID: PolicyOpen}, Asked: Size{2, 512}, Bidders: []string{"did:a"},
		Bids: []Bid{{URI: "at://did:a/bid/1", Bidder: "did:a", Free: true, Size: &Size{1, 256}}}}
	d := Next(s)
	want := "AllRefused: every bid refused: did:a: the bid is for 1 CPU, 256 MiB; the rfp asks 2 CPUs, 512 MiB"
	if d.Reason != ReasonAllRefused || d.Message != want {
		t.Fatalf("Next = %s %q, want %s %q", d.Reason, d.Message, ReasonAllRefused, want)
	}
	s.Bids[0].Size = &Size{2, 512}
	if d := Next(s); d.Action != ActAccept || d.Winner == nil || d.Winner.Bidder != "did:a" {
		t.Fatalf("a bid of the size asked: %+v", d)
	}
}
