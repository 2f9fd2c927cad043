package deno

import "socialweb.computer/internal/substrate"

// boundary and layers are what Boot applies to every guest today: `deno run` as a process of
// the bidder's own uid, on its kernel, in no namespace of its own, held by Deno's permission
// flags alone (deny-all but the guest's own ports, secrets dir and the spec's grants).
//
// Extend the list only with a layer Boot applies to every guest and a test attacks (watch
// it fail without the layer first): the bidder publishes it in its offering, and requesters
// choose bidders by it. When the guest gets its own mount and PID namespaces, the boundary
// becomes substrate.BoundaryNamespace.
var (
	boundary = substrate.BoundaryProcess
	layers   = []string{
		substrate.LayerDenoPermissions, // deno_test.go: TestDeniedNetworkFailsInGuest, TestSecretsReachOnlyTheGuest
	}
)

// Isolation implements substrate.Substrate.
func (s *Substrate) Isolation() substrate.Isolation {
	return substrate.Isolation{Boundary: boundary, Layers: append([]string(nil), layers...)}
}
