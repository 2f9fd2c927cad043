// Package repos is the one way controllers reach an atproto repo: a Repo handle (read,
// write with compare-and-swap, list, delete) and its firehose as an event source, whether
// the repo lives on the embedded PDS or on any other PDS.
//
// The decision that shapes it: no controller holds a token of its own. A Resolver turns an
// AtprotoRepo object into a Repo handle; for a remote repo it logs in once, keeps the
// session (atclient refreshes it), and gates further login attempts behind a capped
// exponential backoff, so a wrong password costs one request per backoff step no matter how
// many controllers ask for the repo. A local repo is an in-process handle on the embedded
// *pds.Server and needs no session at all.
//
// Errors are typed so that controllers map them to condition reasons without parsing
// messages: ErrSwapMismatch, ErrNotFound, ErrInvalidRecord, ErrUnavailable, ErrLoginFailed.
package repos
