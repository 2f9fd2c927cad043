// Package feed is the I/O both market parties share: following a PDS's firehose from a
// cursor, reading another party's record by at-uri, and minting record keys.
package feed

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
)

// Fetcher reads a record of any repo.
type Fetcher func(ctx context.Context, did, collection, rkey string) (*repos.Record, error)

// Local reads records of accounts on the embedded PDS srv.
func Local(srv *pds.Server) Fetcher {
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		r, err := repos.Local(ctx, srv, did)
		if err != nil {
			return nil, err
		}
		return r.Get(ctx, collection, rkey)
	}
}

// Get reads the record at an at-uri.
func (f Fetcher) Get(ctx context.Context, uri string) (*repos.Record, error) {
	u, err := infra.ParseATURI(uri)
	if err != nil {
		return nil, err
	}
	return f(ctx, u.DID.String(), u.Collection.String(), u.Rkey.String())
}

// URI builds at://did/collection/rkey.
func URI(did, collection, rkey string) string { return "at://" + did + "/" + collection + "/" + rkey }

var (
	tidMu    sync.Mutex
	tidClock = syntax.NewTIDClock(0)
)

// TID returns a new record key of the tid kind.
func TID() string {
	tidMu.Lock()
	defer tidMu.Unlock()
	return tidClock.Next().String()
}

// Follow calls fn for every event of src from cursor (0 replays what the PDS keeps) until
// ctx ends, subscribing again from the last seq handled when the stream breaks. An error of
// fn is logged by the caller's fn itself; Follow only stops with ctx. A cursor the source
// says is in its future (a relay or PDS started afresh, numbering from 1 again) is dropped
// for 0: what the source keeps is replayed rather than nothing followed at all.
func Follow(ctx context.Context, src repos.EventSource, cursor int64, fn func(repos.Event)) {
	last := cursor
	for ctx.Err() == nil {
		c := last
		err := src.Subscribe(ctx, &c, func(ev repos.Event) error {
			fn(ev)
			last = ev.Seq
			return nil
		})
		if ctx.Err() != nil || errors.Is(err, context.Canceled) {
			return
		}
		if FutureCursor(err) {
			last = 0
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// FutureCursor says whether err is a source's refusal of a cursor past its newest event.
func FutureCursor(err error) bool {
	return errors.Is(err, pds.ErrFutureCursor) || errors.Is(err, atclient.ErrFatal)
}

// HeadOf is the seq of src's newest event when src can say it (repos.HeadSource); ok is
// false when it cannot, and a follower falls back on its replay falling quiet.
func HeadOf(ctx context.Context, src repos.EventSource) (head int64, ok bool) {
	hs, can := src.(repos.HeadSource)
	if !can {
		return 0, false
	}
	h, err := hs.Head(ctx)
	return h, err == nil
}

// DerivedTID is a record key of the tid kind that is the same every time it is asked for with
// the same seed, time and n: the requester's keys for one contract (seed: the object's UID,
// at: its creation), so that writing a record again after a crash or a stale read finds the
// one written before instead of adding a second.
func DerivedTID(seed string, at time.Time, n int) string {
	h := sha256.Sum256([]byte(seed))
	v := binary.BigEndian.Uint64(h[:8])
	micros := at.Unix()*1_000_000 + int64(v%100_000)*10 + int64(n)
	return syntax.NewTID(micros, uint((v>>32)%1024)).String()
}

// PutOnce writes value at collection/rkey unless a record is there already, and returns
// where the record is (the existing one, if any).
func PutOnce(ctx context.Context, repo repos.Repo, collection, rkey string, value []byte) (*repos.Record, error) {
	w, err := repo.Put(ctx, collection, rkey, value, new(string))
	if err == nil {
		return &repos.Record{URI: w.URI, CID: w.CID, Value: value}, nil
	}
	if !errors.Is(err, repos.ErrSwapMismatch) {
		return nil, err
	}
	return repo.Get(ctx, collection, rkey)
}

// Remote reads records through the PDS at service (the one whose firehose is followed: the
// records its events name are hosted there).
func Remote(service string) Fetcher {
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		return repos.GetPublic(ctx, service, did, collection, rkey)
	}
}

// Source is one firehose a market party follows besides its own PDS's, with the reader of
// the records its events name.
type Source struct {
	// Endpoint names the source (its URL): one follower per endpoint.
	Endpoint string
	Events   repos.EventSource
	Fetch    Fetcher
	// Local says the source is the PDS of this process, whatever port it has this run.
	Local bool
}

// LocalCursorKey is the cursor key of the PDS of this process: it listens on a port picked
// at each start by default, and a key naming the port would make every restart replay its
// whole firehose.
const LocalCursorKey = "local-pds"

// CursorKey is what a follower saves its cursor of s under: LocalCursorKey for the PDS of
// this process, else its URL's CursorKey.
func (s Source) CursorKey() string {
	if s.Local {
		return LocalCursorKey
	}
	return CursorKey(s.Endpoint)
}

// Sources are the firehoses at urls, their records read from the same host without a
// session; local (when not nil) is read in-process for the URL it serves. With dir, a record
// the host does not serve (a relay serves no getRecord) is read from the PDS of its DID's
// document instead.
func Sources(urls []string, local *pds.Server, dir identity.Directory) []Source {
	if dir != nil {
		dir = cachingDirectory(dir) // one cache for every source
	}
	var out []Source
	for _, u := range urls {
		out = append(out, SourceOf(u, local, dir))
	}
	return out
}

// SourceOf is the firehose at url (see Sources).
func SourceOf(url string, local *pds.Server, dir identity.Directory) Source {
	if local != nil && strings.TrimSuffix(url, "/") == strings.TrimSuffix(local.URL(), "/") {
		return Source{Endpoint: local.URL(), Events: repos.LocalFirehose(local), Fetch: Local(local), Local: true}
	}
	f := Remote(url)
	if dir != nil {
		f = f.OrLearn(ByDID(cachingDirectory(dir)))
	}
	return Source{Endpoint: url, Events: repos.Firehose(url), Fetch: f}
}

// cachingDirectory is dir behind a cache, unless it already is one: every record a relay's
// event names is read through its DID's document, and a look-up per read would cost each
// read a round trip to the directory. An hour, as the service-auth verifier keeps them: an
// account that moves is read from its old PDS until then (which fails, and says so).
func cachingDirectory(dir identity.Directory) identity.Directory {
	if _, ok := dir.(*identity.CacheDirectory); ok {
		return dir
	}
	return identity.NewCacheDirectory(dir, 100_000, time.Hour, time.Minute, time.Minute)
}

// ByDID reads a record from the PDS that its DID's document names, without a session.
func ByDID(dir identity.Directory) Fetcher {
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		d, err := syntax.ParseDID(did)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", repos.ErrNotFound, err)
		}
		id, err := dir.LookupDID(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("%w: resolving %s: %v", repos.ErrUnavailable, did, err)
		}
		ep := id.PDSEndpoint()
		if ep == "" {
			return nil, fmt.Errorf("%w: %s names no PDS", repos.ErrUnavailable, did)
		}
		return repos.GetPublic(ctx, ep, did, collection, rkey)
	}
}

// Or reads through f, and through g when f fails.
func (f Fetcher) Or(g Fetcher) Fetcher {
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		rec, err := f(ctx, did, collection, rkey)
		if err == nil {
			return rec, nil
		}
		return g(ctx, did, collection, rkey)
	}
}

// OrLearn reads through f, and through g when f fails, as Or does (g's error when both
// fail); once g has read what f could not, g is asked first, until f reads what g could
// not. For a relay's URL (f), which serves no record, that spares every later read the
// refused request.
func (f Fetcher) OrLearn(g Fetcher) Fetcher {
	var gFirst atomic.Bool
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		swapped := gFirst.Load()
		first, second := f, g
		if swapped {
			first, second = g, f
		}
		rec, err1 := first(ctx, did, collection, rkey)
		if err1 == nil {
			return rec, nil
		}
		rec, err2 := second(ctx, did, collection, rkey)
		if err2 == nil {
			gFirst.Store(!swapped) // the one that read it goes first
			return rec, nil
		}
		if swapped {
			return nil, err1
		}
		return nil, err2
	}
}

// Router is a Fetcher over several PDSes: a DID's records are read from the PDS whose
// firehose carried its events (Learn); a DID not seen yet is looked for on each in turn.
type Router struct {
	mu    sync.Mutex
	all   []Fetcher
	byDID map[string]Fetcher
}

// NewRouter routes between fetchers, the first tried first.
func NewRouter(fetchers ...Fetcher) *Router {
	return &Router{all: fetchers, byDID: map[string]Fetcher{}}
}

// Learn says that did's records are read through f.
func (r *Router) Learn(did string, f Fetcher) {
	r.mu.Lock()
	r.byDID[did] = f
	r.mu.Unlock()
}

// Fetcher reads through the router.
func (r *Router) Fetcher() Fetcher {
	return func(ctx context.Context, did, collection, rkey string) (*repos.Record, error) {
		r.mu.Lock()
		f, ok := r.byDID[did]
		all := r.all
		r.mu.Unlock()
		if ok {
			return f(ctx, did, collection, rkey)
		}
		err := error(repos.ErrNotFound)
		for _, f := range all {
			rec, ferr := f(ctx, did, collection, rkey)
			if ferr == nil {
				return rec, nil
			}
			if !errors.Is(ferr, repos.ErrNotFound) || errors.Is(err, repos.ErrNotFound) {
				err = ferr
			}
		}
		return nil, err
	}
}
