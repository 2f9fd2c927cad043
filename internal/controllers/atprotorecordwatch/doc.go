// Package atprotorecordwatch is the reconciler of AtprotoRecordWatch: for each watch it runs
// one follower goroutine on the firehose of the PDS hosting the repo, from the cursor kept
// in the watch's status, keeps status.records and status.deleted for the repo's collection,
// and publishes each change on the watch.Broker for the controllers that map changes to
// their objects. There is no polling timer: the firehose is the only trigger.
//
// The decision that shapes it: the status is the follower's checkpoint. A change is
// published only after the status holding it and the cursor past it has been written, and
// a follower (re)starts from the cursor in the status. A PDS restart (the stream breaks and
// is resumed from the cursor) or a process restart therefore neither loses a change nor
// applies one twice. Events of other repos and collections advance the cursor in memory
// and are checkpointed lazily; replaying them after a restart changes nothing. Events that
// queue up while a checkpoint is being written are folded in together under the next one,
// so a burst of changes costs a few status writes, not one (of the whole list) per change.
package atprotorecordwatch
