// Package atprotorecord is the reconciler of AtprotoRecord: it keeps one record written in
// a repo with putRecord and swapRecord, repairs drift, and on deletion deletes or retains
// the record per deletionPolicy.
//
// A reconcile runs in steps, each in its own file: finalize.go (deletion), then
// ensure the finalizer (before any write, so a record is never leaked), then sync.go (read,
// decide, write), then status once. The decisions are pure functions in decide.go:
// prepare (normalise and validate the spec's record) and decide (what to do given what the
// repo holds), tested by tables.
//
// Changes made to the record elsewhere reach the controller through the watch.Broker, fed
// by AtprotoRecordWatch objects following the repo's firehose; without a watch on the
// collection, drift is repaired at the next resync (ResyncPeriod).
package atprotorecord
