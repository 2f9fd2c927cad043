// Package computecontract is the requester: it runs a ComputeContract through the market
// from the requester's repo (spec.repoRef), learning of bids, receipts and events from the
// firehose, and records the outcome in the status.
//
// The decisions are pure functions of internal/market: market.Next decides what to write and
// the phase to record, market.StateOf names the stage it stands in. A reconcile runs in
// steps, one file each, like Karpenter's NodeClaim lifecycle, in this order:
//
//  1. read (read.go): the release finalizer on before anything is written to the market, or
//     off for a final contract being deleted; the spec as a market.State (specState: a bad
//     spec fails the contract); our repo, with the index caught up on its firehose; then
//     observe: the rfp's time, the bids and bidders, and (receipt.go, observeReceipt) our
//     accept, the receipt that binds it and the winner's events on it. The status keeps the
//     bids, the receipt, the guest's address and the events seen.
//  2. the step of the stage, applying market.Next's decision:
//     Unpublished: publish (publish.go) writes the compute.vm payload, the policy and the rfp;
//     Bidding: accept (accept.go) marks the refused bids and writes the accept for the winner;
//     Accepted: nothing is written while the receipt is awaited (a deadline requeue);
//     Bound: guest (guest.go) delivers the secrets, or writes the delete of a guest that
//     missed its ready timeout;
//     Releasing: release (release.go) writes the delete event on the receipt.
//     A step's error is reported on the object (stepFailure, failure.go): a record the PDS
//     refused is RecordRejected and waits for a spec change; any other is StepFailed and
//     goes back to the queue with its backoff.
//  3. finish (status.go): the decided phase, reason and message written once through
//     reconcilekit; a contract that ended forgets its rfp's time and, when it is being
//     deleted, drops its finalizer (finalize.go).
//
// Results combine with reconcilekit.Merge: the soonest requeue wins.
package computecontract
