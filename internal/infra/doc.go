// Package infra holds every decision the Infra and EphemeralInfra controllers make, as pure
// functions of values: which way a deployment and its atproto record sync (Decide), what the
// record says (RenderRecord), which ComputeContracts to create, release or delete
// (PlanContracts, FinalizePlan), what phase a contract and a deployment are in, when an
// EphemeralInfra ends, which record key a fresh bind takes (Successor, NextRkey), how the
// account's index at rkey self changes (IndexPass, IndexEnd) and which children a collection
// creates (PlanCollection).
//
// The one decision that shapes the package: decisions are values in, action out. Nothing here
// holds a client, reads the clock or does I/O; time is a parameter and every input is a plain
// value the reconciler has already read (the object, its ComputeContracts, the record it just
// fetched with getRecord). The reconcilers read, call one of these functions, and apply what
// it returns. That keeps the rules of the sync (the record wins a true conflict, no edit is
// lost silently, the stored declaration hash advances only when both sides agree) in one
// place where table tests and a property test can drive every interleaving without an API
// server or a PDS.
//
// Files, one concern each: declaration.go (the declaration both sides may change, its hash
// and the state and phase vocabularies), record.go (the record value and the status write
// throttle), sync.go (Decide), successor.go (record keys and successor rkeys), uri.go (AT
// URIs of bound records), lifecycle.go (contracts, phases, ephemeral end, finalizer),
// index.go (the index at self) and collection.go (collections).
package infra
