// Package reconcilekit is the one way a controller here writes what it owns on an object:
// its finalizer, its status, and what a reconcile returns when a write met a conflict.
//
// Every write is guarded by the resourceVersion the controller read (an optimistic lock, as
// kcp's committer and Karpenter do): a plain merge patch from a stale read silently drops a
// concurrent writer's change to the same list (finalizers, conditions), while a locked one
// fails with a conflict, and a conflict only means "read again". So a conflict is never an
// error here: it becomes a short requeue, logged at V(1). A status is compared before it is
// written, so an unchanged status costs no write, and a reconcile's sub-steps combine their
// results with Merge and Join (the soonest requeue wins, errors are joined) rather than the
// deprecated Result.Requeue.
//
// A status with several writers (the Cluster's: its controller and the node host) is the
// exception to the lock: each writer applies its own part by server-side apply under its
// own field manager (ApplyStatus), and the API server merges the parts, so there is no
// conflict to read again for.
package reconcilekit
