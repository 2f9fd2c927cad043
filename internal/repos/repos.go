package repos

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"

	"socialweb.computer/internal/firehose"
)

// Typed errors of Repo calls; test with errors.Is.
var (
	// ErrSwapMismatch: the repo does not hold the CID the write was conditioned on.
	ErrSwapMismatch = errors.New("swap mismatch")
	// ErrNotFound: the record does not exist.
	ErrNotFound = errors.New("record not found")
	// ErrInvalidRecord: the PDS refused the record's content.
	ErrInvalidRecord = errors.New("invalid record")
	// ErrUnavailable: the repo cannot be reached now (no PDS, network, account missing).
	ErrUnavailable = errors.New("repo unavailable")
	// ErrLoginFailed: the PDS refused the credentials.
	ErrLoginFailed = errors.New("login failed")
	// ErrNoEmbeddedPDS: a local repo (spec.local) was asked of a process that runs no
	// embedded PDS (socialweb controllers against a cluster). It is also ErrUnavailable;
	// its message says what to write instead.
	ErrNoEmbeddedPDS = errors.New("no embedded PDS")
)

// Record is one record as read from a repo.
type Record struct {
	URI   string
	CID   string
	Value json.RawMessage
}

// WriteResult is where a write left the record.
type WriteResult struct {
	URI string
	CID string
	// Changed is false when the record already held the value (no commit was made).
	Changed bool
}

// Repo is a handle on one account's repo.
type Repo interface {
	// DID is the account's DID.
	DID() string
	// Handle is the account's handle as last resolved.
	Handle() string
	// Endpoint is the URL of the PDS hosting the repo.
	Endpoint() string
	// Get reads a record; a missing record is ErrNotFound.
	Get(ctx context.Context, collection, rkey string) (*Record, error)
	// Put creates or replaces a record. swapCID nil writes unconditionally; "" requires that
	// the record does not exist; a CID requires that the repo holds it (else ErrSwapMismatch).
	Put(ctx context.Context, collection, rkey string, value json.RawMessage, swapCID *string) (*WriteResult, error)
	// Delete removes a record (a missing record is not an error); swapCID as in Put, non-empty only.
	Delete(ctx context.Context, collection, rkey string, swapCID *string) error
	// List pages through a collection in ascending rkey order; cursor "" starts at the beginning.
	List(ctx context.Context, collection, cursor string, limit int) ([]Record, string, error)
	// Events is the firehose of the PDS hosting the repo (all repos on it, not only this one).
	Events() EventSource
}

// ServiceAuther is a Repo that can mint atproto service-auth tokens for its account (what
// com.atproto.server.getServiceAuth gives): a token for a call of lxm on the service aud,
// valid for ttl (at most an hour). Both repos of this package implement it.
type ServiceAuther interface {
	ServiceAuth(ctx context.Context, aud, lxm string, ttl time.Duration) (string, error)
}

// Op is one record operation of a commit.
type Op struct {
	Action     string // create, update, delete
	Collection string
	RKey       string
	CID        string // "" for delete
}

// Event is one firehose event, reduced to what record followers need. Events that are not
// commits carry only Seq, so that a follower's cursor still advances past them.
type Event struct {
	Seq  int64
	DID  string
	Ops  []Op
	Time time.Time
}

// EventSource streams the firehose of one PDS.
type EventSource interface {
	// Subscribe calls fn for every event after cursor (nil: live only) in seq order until ctx
	// ends, fn fails, or the stream breaks; it returns why. A caller that wants to go on
	// subscribes again from the last seq it handled.
	Subscribe(ctx context.Context, cursor *int64, fn func(Event) error) error
}

// HeadSource is an EventSource that can say the seq of its newest event (0: none), so that a
// follower replaying from the start knows exactly when it has caught up rather than waiting
// for the replay to fall quiet. The embedded PDS's firehose is one; a remote firehose offers
// no such call.
type HeadSource interface {
	Head(ctx context.Context) (int64, error)
}

// fromFirehose reduces a decoded firehose event. What a PDS sends is checked here, where it
// enters: an event whose repo is not a DID carries only its Seq, and an op whose path is not
// <collection>/<rkey> is dropped (its parts go into at-uris and record reads).
func fromFirehose(ev *firehose.Event) Event {
	did, err := syntax.ParseDID(ev.DID())
	if err != nil {
		return Event{Seq: ev.Seq}
	}
	out := Event{Seq: ev.Seq, DID: did.String()}
	if ev.Commit == nil {
		return out
	}
	if t, err := time.Parse(time.RFC3339Nano, ev.Commit.Time); err == nil {
		out.Time = t
	}
	for _, op := range ev.Commit.Ops {
		if op == nil {
			continue
		}
		coll, rkey, ok := strings.Cut(op.Path, "/")
		if _, err := syntax.ParseNSID(coll); !ok || err != nil {
			continue
		}
		if _, err := syntax.ParseRecordKey(rkey); err != nil {
			continue
		}
		o := Op{Action: op.Action, Collection: coll, RKey: rkey}
		if op.Cid != nil {
			o.CID = cid.Cid(*op.Cid).String()
		}
		out.Ops = append(out.Ops, o)
	}
	return out
}

// RetryAfter returns how long the caller should wait before asking again after err, or 0
// when err says nothing about it.
func RetryAfter(err error) time.Duration {
	var ra interface{ RetryAfter() time.Duration }
	if errors.As(err, &ra) {
		return ra.RetryAfter()
	}
	return 0
}

// backoffError is an error that carries how long to wait before the next attempt.
type backoffError struct {
	err   error
	retry time.Duration
}

func (e *backoffError) Error() string             { return e.err.Error() }
func (e *backoffError) Unwrap() error             { return e.err }
func (e *backoffError) RetryAfter() time.Duration { return e.retry }

// Backoff is the wait after n consecutive failures: base doubled n-1 times, capped at max;
// zero for n <= 0.
func Backoff(n int, base, max time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n; i++ {
		d *= 2
		if d >= max {
			return max
		}
	}
	if d > max {
		return max
	}
	return d
}
