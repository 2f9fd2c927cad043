package repos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
)

// remoteRepo is an account on any PDS, reached over XRPC with a password session that
// atclient refreshes on ExpiredToken.
type remoteRepo struct {
	c       *atclient.Client
	service string
	sess    atclient.Session
	// onAuthLost is called when the PDS stops accepting the session (refresh refused).
	onAuthLost func()
}

// login opens a session for identifier on service.
func login(ctx context.Context, service, identifier, password string) (*remoteRepo, error) {
	c := atclient.New(service)
	s, err := c.Login(ctx, identifier, password)
	if err != nil {
		return nil, remoteErr(err)
	}
	return &remoteRepo{c: c, service: service, sess: *s}, nil
}

func (r *remoteRepo) DID() string { return r.sess.DID }

// ServiceAuth implements ServiceAuther with com.atproto.server.getServiceAuth on the PDS.
func (r *remoteRepo) ServiceAuth(ctx context.Context, aud, lxm string, ttl time.Duration) (string, error) {
	tok, err := r.c.GetServiceAuth(ctx, aud, lxm, time.Now().Add(ttl).Unix())
	if err != nil {
		return "", r.err(err)
	}
	return tok, nil
}
func (r *remoteRepo) Handle() string   { return r.sess.Handle }
func (r *remoteRepo) Endpoint() string { return r.service }

func (r *remoteRepo) Get(ctx context.Context, collection, rkey string) (*Record, error) {
	rec, err := r.c.GetRecord(ctx, r.sess.DID, collection, rkey)
	if err != nil {
		return nil, r.err(err)
	}
	return &Record{URI: rec.URI, CID: rec.CID, Value: rec.Value}, nil
}

func (r *remoteRepo) Put(ctx context.Context, collection, rkey string, value json.RawMessage, swapCID *string) (*WriteResult, error) {
	if _, err := decodeObject(value); err != nil {
		return nil, err
	}
	res, err := r.c.PutRecord(ctx, collection, rkey, value, remoteSwap(swapCID))
	if err != nil {
		return nil, r.err(err)
	}
	return &WriteResult{URI: res.URI, CID: res.CID, Changed: res.Commit != nil}, nil
}

func (r *remoteRepo) Delete(ctx context.Context, collection, rkey string, swapCID *string) error {
	_, err := r.c.DeleteRecord(ctx, collection, rkey, remoteSwap(swapCID))
	return r.err(err)
}

func (r *remoteRepo) List(ctx context.Context, collection, cursor string, limit int) ([]Record, string, error) {
	recs, next, err := r.c.ListRecords(ctx, r.sess.DID, collection, limit, cursor, true)
	if err != nil {
		return nil, "", r.err(err)
	}
	out := make([]Record, len(recs))
	for i, rec := range recs {
		out[i] = Record{URI: rec.URI, CID: rec.CID, Value: rec.Value}
	}
	return out, next, nil
}

func (r *remoteRepo) Events() EventSource { return remoteEvents{host: r.service} }

type remoteEvents struct{ host string }

// Firehose is the subscribeRepos stream of the PDS (or relay) at service, without a session.
func Firehose(service string) EventSource { return remoteEvents{host: service} }

// Subscribe follows the PDS's subscribeRepos over one connection at a time: atclient's
// Consumer reconnects from its last seq with its own backoff, so Subscribe returns only when
// ctx ends, fn fails, or the PDS refuses the cursor.
func (e remoteEvents) Subscribe(ctx context.Context, cursor *int64, fn func(Event) error) error {
	c := &atclient.Consumer{Host: e.host, Cursor: cursor, Handle: func(ev *firehose.Event) error { return fn(fromFirehose(ev)) }}
	return c.Run(ctx)
}

func remoteSwap(s *string) *atclient.Swap {
	if s == nil {
		return nil
	}
	return &atclient.Swap{CID: *s}
}

func remoteErr(err error) error {
	if err == nil {
		return nil
	}
	var xe *atclient.XRPCError
	if !errors.As(err, &xe) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return mapXRPC(xe.Name, xe.Status, err)
}

// err maps err and drops the session when the PDS no longer accepts it.
func (r *remoteRepo) err(err error) error {
	err = remoteErr(err)
	if errors.Is(err, ErrLoginFailed) && r.onAuthLost != nil {
		r.onAuthLost()
	}
	return err
}

// Login opens a password session for identifier on the PDS at service and returns its repo.
// It is for a process that runs without a Resolver (`socialweb bidder`); the session is
// refreshed by atclient, and a refused refresh surfaces as ErrLoginFailed.
func Login(ctx context.Context, service, identifier, password string) (Repo, error) {
	rr, err := login(ctx, service, identifier, password)
	if err != nil {
		return nil, err
	}
	return rr, nil
}

// GetPublic reads a record of any repo hosted by the PDS at service, without a session.
func GetPublic(ctx context.Context, service, did, collection, rkey string) (*Record, error) {
	rec, err := atclient.New(service).GetRecord(ctx, did, collection, rkey)
	if err != nil {
		return nil, remoteErr(err)
	}
	return &Record{URI: rec.URI, CID: rec.CID, Value: rec.Value}, nil
}
