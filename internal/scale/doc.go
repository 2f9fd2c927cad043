// Package scale decides how many nodes a tenant cluster needs: Provision n more, Release
// these empty nodes, or Hold, each with a reason, and when to look again.
//
// The decision is a pure function of values (Decide): the cluster's pods, nodes and
// NodeClaims, its limits and the time. It holds no client, reads no clock and imports
// nothing of k8s.io/kubernetes; the caller reads the tenant cluster, fills the small input
// structs of this package, applies the decision (a NodeClaim written or deleted) and calls
// again after Decision.RequeueAfter or on the next event.
//
// The one decision that shapes the package: the only memory between two calls is the time
// each node was first seen empty (State.EmptySince), returned in the Decision and handed
// back by the caller. Everything else (which pods are pending since when, which claims are
// in flight) is read again each time, so a restarted caller decides as if it never stopped,
// at worst restarting a node's hold.
package scale
