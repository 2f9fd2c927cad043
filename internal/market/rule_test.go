package market

import (
	"slices"
	"strings"
	"testing"
)

func TestParseArch(t *testing.T) {
	for _, in := range []string{"", "amd64", "arm64", "riscv64", "ppc64le", "s390x"} {
		if got, err := ParseArch(in); err != nil || got != in {
			t.Errorf("ParseArch(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"AMD64", "x86_64", "arm 64", "a", " amd64", strings.Repeat("a", 40)} {
		if _, err := ParseArch(in); err == nil {
			t.Errorf("ParseArch(%q) accepted", in)
		}
	}
}

// A contract that requires an architecture waits only for bidders whose offering states it,
// and refuses the bids of the others with a reason naming the requirement and what they
// stated.
func TestOfferingRuleArch(t *testing.T) {
	stated := map[string][]string{"did:amd": {"amd64"}, "did:both": {"amd64", "arm64"}, "did:arm": {"arm64"}}
	all := []string{"did:amd", "did:arm", "did:both", "did:silent"}
	for _, c := range []struct {
		arch    string
		waits   []string
		refused map[string]string
	}{
		{"", all, nil},
		{"arm64", []string{"did:arm", "did:both"}, map[string]string{
			"did:amd":    "requireArch arm64: the bidder's offering states amd64",
			"did:silent": "requireArch arm64: the bidder's offering states no architecture"}},
		{"amd64", []string{"did:amd", "did:both"}, map[string]string{
			"did:arm":    "requireArch amd64: the bidder's offering states arm64",
			"did:silent": "requireArch amd64: the bidder's offering states no architecture"}},
	} {
		t.Run("require "+c.arch, func(t *testing.T) {
			rule := OfferingRule{Arch: c.arch, Kind: "node", StatedArchs: stated}
			if rule.Requires() != (c.arch != "") {
				t.Errorf("Requires() = %v", rule.Requires())
			}
			if got := Bidders(all, nil, nil, rule); !slices.Equal(got, c.waits) {
				t.Errorf("waits for %v, want %v", got, c.waits)
			}
			var bids []Bid
			for _, d := range all {
				bids = append(bids, Bid{URI: "at://" + d + "/bid/1", Bidder: d, Free: true})
			}
			w, refused := Choose(bids, Size{}, nil, nil, Policy{NSID: PolicyOpen}, rule)
			if w == nil || !slices.Contains(c.waits, w.Bidder) {
				t.Errorf("winner %v, want one of %v", w, c.waits)
			}
			got := map[string]string{}
			for _, r := range refused {
				got[r.Bid.Bidder] = r.Reason
			}
			if len(got) != len(c.refused) {
				t.Errorf("refused %v, want %v", got, c.refused)
			}
			for d, want := range c.refused {
				if got[d] != want {
					t.Errorf("%s refused for %q, want %q", d, got[d], want)
				}
			}
		})
	}
	if s := (OfferingRule{Require: BoundaryVM, Layers: []string{"kvm"}, Arch: "arm64"}).String(); s != "requireIsolation vm, requireLayers kvm, requireArch arm64" {
		t.Errorf("String() = %q", s)
	}
}
