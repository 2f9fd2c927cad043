package market

import (
	"fmt"
	"slices"
	"strings"
)

// Boundary is what stands between a guest and its bidder's host, as the bidder's offering
// states it for one substrate. Weakest first: none (the offering says nothing), process,
// namespace, vm.
type Boundary string

const (
	// BoundaryNone: the offering states nothing for the kind (an older bidder, or an
	// unknown value). It meets no requirement.
	BoundaryNone Boundary = ""
	// BoundaryProcess: the guest is a process of the bidder's, on its kernel, with no
	// namespace of its own; what holds it is the runtime's own checks (Deno's permissions).
	BoundaryProcess Boundary = "process"
	// BoundaryNamespace: Linux namespaces (and cgroups) on the bidder's own kernel.
	BoundaryNamespace Boundary = "namespace"
	// BoundaryVM: a hardware-virtualized or emulated machine per guest, with its own kernel.
	BoundaryVM Boundary = "vm"
)

func (b Boundary) rank() int {
	switch b {
	case BoundaryVM:
		return 3
	case BoundaryNamespace:
		return 2
	case BoundaryProcess:
		return 1
	}
	return 0 // none, or a value this requester does not know: says nothing it can rely on
}

// AtLeast says whether b is as strong as req or stronger. Every boundary meets the empty
// requirement.
func (b Boundary) AtLeast(req Boundary) bool { return req == BoundaryNone || b.rank() >= req.rank() }

// ParseRequirement reads spec.requireIsolation: "" (none), "namespace" or "vm".
func ParseRequirement(spec string) (Boundary, error) {
	switch b := Boundary(strings.TrimSpace(spec)); b {
	case BoundaryNone, BoundaryNamespace, BoundaryVM:
		return b, nil
	}
	return "", fmt.Errorf("requireIsolation %q: want vm or namespace", spec)
}

// Isolation is one entry of an offering's isolation: what the bidder applies to the guests
// of one substrate.
type Isolation struct {
	Substrate string
	Boundary  Boundary
	Layers    []string
}

// StatedBoundary is the boundary entries state for guests of kind: BoundaryNone when no entry
// names kind; the weakest when several do (a bidder may not pick the stronger for us).
func StatedBoundary(entries []Isolation, kind string) Boundary {
	var out Boundary
	seen := false
	for _, e := range entries {
		if e.Substrate != kind {
			continue
		}
		if !seen || e.Boundary.rank() < out.rank() {
			out = e.Boundary
		}
		seen = true
	}
	return out
}

// StatedLayers are the layers entries state for guests of kind: those every entry naming
// kind states (a bidder may not pick the stronger entry for us); nil when none names it.
func StatedLayers(entries []Isolation, kind string) []string {
	var out []string
	seen := false
	for _, e := range entries {
		if e.Substrate != kind {
			continue
		}
		if !seen {
			out = append([]string(nil), e.Layers...)
			seen = true
			continue
		}
		out = slices.DeleteFunc(out, func(l string) bool { return !slices.Contains(e.Layers, l) })
	}
	return out
}
