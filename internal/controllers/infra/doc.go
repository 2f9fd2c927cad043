// Package infra is the reconciler of Infra and EphemeralInfra: deployments that own their
// ComputeContracts and stay in sync, both ways, with a computer.socialweb.infra (or
// ephemeralInfra) record.
//
// One Reconciler serves both kinds through a small adapter over their shared spec and
// status. A reconcile runs in steps, one file each, like Karpenter's NodeClaim lifecycle:
// finalize.go (a deleted object: release, wait, final record write, index end, let go), the
// release finalizer before any side effect (controller.go), ephemeral.go (deadline and end),
// contracts.go (PlanContracts applied), record.go (bind, getRecord, Decide, pull by
// server-side apply or write through the AtprotoRecord child), watch.go (the repo's
// AtprotoRecordWatch and the broker mapping), index.go (the index at self) and status.go (one
// status patch).
//
// The decision that shapes it: the reconciler decides nothing itself. Every choice is a pure
// function of internal/infra called on values the reconciler has just read; the reconciler
// only reads, calls, applies and writes status once. docs/infra.md records how.
package infra
