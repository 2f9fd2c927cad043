// Package atprotorepo is the reconciler of AtprotoRepo: it asks the repos.Resolver for a
// handle on the repo (which logs in, for a remote repo) and reports who the account is and
// whether it is usable: status did, handle, endpoint and the Ready condition (LoggedIn,
// LoginFailed, Unreachable, LocalRepoUnavailable: spec.local where no embedded PDS runs,
// with a message saying to use spec.remote).
//
// It never retries a refused login itself: the resolver gates logins behind a capped
// exponential backoff shared by every controller, and this reconciler only requeues for the
// moment the resolver says the next attempt is allowed. A changed Secret starts afresh.
package atprotorepo
