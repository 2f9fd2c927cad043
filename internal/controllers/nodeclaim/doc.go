// Package nodeclaim is the NodeClaim controller: it turns each NodeClaim of a tenant
// cluster into one contract entry of its Cluster's Infra, and reports the entry's progress
// on the claim.
//
// A tenant cluster's nodes are one deployment. The Infra (internal/infra ClusterInfraName)
// lives in the gateway's contract workspace, beside the ComputeContracts it owns; the Infra
// controller runs each node's ComputeContract through its whole lifecycle, exactly as for
// any other deployment. This controller is the Infra's composer and the only writer of its
// spec: a claim adds its entry (Staged until its join bundle Secret is written, then
// Requested), a deleting or ended claim sets it Released, and a claim that lets go drops it;
// the last entry dropped deletes the Infra.
//
// The one decision that shapes the package: every write reads the Infra, changes only this
// claim's entry (infra.ComposeNodeEntry) and writes the whole spec back with an optimistic
// lock, under one in-process lock per Infra. The lock keeps the claims of one cluster from
// conflicting with each other in this process; the optimistic lock keeps any other writer
// (another process, a stale read) from losing an entry.
//
// Steps, one file each: cluster.go (a deleted Cluster deletes its Infra), bundle.go (the
// join bundle Secret), entry.go (compose and write under the lock), finalize.go (the claim's
// release finalizer), status.go (the claim's phase and status.infra, written once), watch.go
// (the events that wake a claim), resync.go (the sweep at start).
package nodeclaim
