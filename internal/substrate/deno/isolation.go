package deno

import "socialweb.computer/internal/substrate"

// boundary and layers are what Boot applies to every guest: a jail (package jail) with its
// own mount, PID, IPC and UTS namespaces, a uid of its own without capabilities, the
// contract's cgroup limits and a seccomp filter, and Deno's permission flags inside it. The
// network namespace is the host's (guests answer on host loopback ports), so
// network-namespace is not a layer; nor is user-namespace (the guest's uid is an
// unprivileged host uid, not one mapped in a user namespace).
//
// Extend the list only with a layer Boot applies to every guest and a test attacks (watch
// it fail without the layer first): the bidder publishes it in its offering, and requesters
// choose bidders by it.
var (
	boundary = substrate.BoundaryNamespace
	layers   = []string{
		substrate.LayerMountNamespace,  // security_test.go: TestGuestStaticImportsOfHostFiles, TestGuestIsJailed; jail: TestJailAloneHidesTheHost
		substrate.LayerPIDNamespace,    // security_test.go: TestGuestIsJailed (its /proc lists only its own processes)
		substrate.LayerSeccomp,         // jail: TestJailAloneHidesTheHost (unshare, ptrace, userfaultfd refused)
		substrate.LayerCgroupLimits,    // security_test.go: TestGuestPastItsMemoryIsKilled, TestGuestIsJailed (limits set)
		substrate.LayerNoNewPrivs,      // security_test.go: TestGuestIsJailed; jail: TestJailAloneHidesTheHost
		substrate.LayerDenoPermissions, // deno_test.go: TestDeniedNetworkFailsInGuest, TestSecretsReachOnlyTheGuest; security_test.go: TestGuestCannotReachTheHost
	}
)

// Isolation implements substrate.Substrate.
func (s *Substrate) Isolation() substrate.Isolation {
	return substrate.Isolation{Boundary: boundary, Layers: append([]string(nil), layers...)}
}
