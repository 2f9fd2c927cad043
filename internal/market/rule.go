package market

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// OfferingRule is what a contract requires of its winner's offering (requireIsolation,
// requireLayers, requireArch) and what each bidder's offering stated.
type OfferingRule struct {
	// Require is the weakest boundary the contract accepts (BoundaryNone: any bidder).
	Require Boundary
	// Layers are layers the winner's offering must state (none: any bidder).
	Layers []string
	// Arch is the CPU architecture the winner's offering must state, by its kubernetes.io/arch
	// name ("": any).
	Arch string
	// Kind is the contract's computeKind: the substrate whose entry counts.
	Kind string
	// Stated is the boundary each bidder's offering states for Kind (a bidder absent from
	// it: no offering seen, which states nothing).
	Stated map[string]Boundary
	// StatedLayers are the layers each bidder's offering states for Kind.
	StatedLayers map[string][]string
	// StatedArchs are the architectures each bidder's offering states.
	StatedArchs map[string][]string
}

// archName is a kubernetes.io/arch value as Go names architectures (amd64, arm64, riscv64,
// ppc64le, s390x, ...).
var archName = regexp.MustCompile(`^[a-z][a-z0-9]{1,31}$`)

// ParseArch reads spec.requireArch: "" (any) or an architecture's name.
func ParseArch(spec string) (string, error) {
	if spec == "" || archName.MatchString(spec) {
		return spec, nil
	}
	return "", fmt.Errorf("requireArch %q: want an architecture as kubernetes.io/arch names it (amd64, arm64)", spec)
}

// Requires says whether the rule refuses any bidder at all.
func (r OfferingRule) Requires() bool {
	return r.Require != BoundaryNone || len(r.Layers) > 0 || r.Arch != ""
}

// String names the requirement, e.g. "requireIsolation vm, requireLayers pod-user-namespaces".
func (r OfferingRule) String() string {
	var parts []string
	if r.Require != BoundaryNone {
		parts = append(parts, "requireIsolation "+string(r.Require))
	}
	if len(r.Layers) > 0 {
		parts = append(parts, "requireLayers "+strings.Join(r.Layers, " "))
	}
	if r.Arch != "" {
		parts = append(parts, "requireArch "+r.Arch)
	}
	return strings.Join(parts, ", ")
}

// Allows says whether bidder may win under the rule: nil, or an error naming the
// requirement and what the bidder's offering said.
func (r OfferingRule) Allows(bidder string) error {
	if r.Require != BoundaryNone {
		got := r.Stated[bidder]
		if !got.AtLeast(r.Require) {
			said := "states no isolation"
			if got != BoundaryNone {
				said = "states boundary " + string(got)
			}
			return fmt.Errorf("requireIsolation %s: the bidder's offering %s for %s guests", r.Require, said, r.Kind)
		}
	}
	var missing []string
	for _, l := range r.Layers {
		if !slices.Contains(r.StatedLayers[bidder], l) {
			missing = append(missing, l)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("requireLayers %s: the bidder's offering does not state %s for %s guests", strings.Join(r.Layers, " "), strings.Join(missing, ", "), r.Kind)
	}
	if r.Arch != "" && !slices.Contains(r.StatedArchs[bidder], r.Arch) {
		said := "states no architecture"
		if got := r.StatedArchs[bidder]; len(got) > 0 {
			said = "states " + strings.Join(got, ", ")
		}
		return fmt.Errorf("requireArch %s: the bidder's offering %s", r.Arch, said)
	}
	return nil
}
