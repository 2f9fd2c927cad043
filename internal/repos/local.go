package repos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds"
)

// localRepo is an account on the embedded PDS, reached in-process.
type localRepo struct {
	srv         *pds.Server
	did, handle string
}

// Local returns a handle on the account ident (handle or DID) of the embedded PDS srv.
func Local(ctx context.Context, srv *pds.Server, ident string) (Repo, error) {
	if srv == nil {
		return nil, fmt.Errorf("%w: %w: spec.local is an account on the PDS that socialweb up embeds, and these controllers run none; "+
			"use an account on a PDS they reach instead: spec.remote with service (the PDS's URL), identifier (the account's handle or DID) "+
			"and credentialsRef naming a Secret (socialweb.computer/v1alpha1) whose key password holds an app password "+
			"(README, \"Run on your cluster\")", ErrUnavailable, ErrNoEmbeddedPDS)
	}
	did, handle, err := srv.Account(ctx, ident)
	if err != nil {
		return nil, fmt.Errorf("%w: account %s on the embedded PDS: %v", ErrUnavailable, ident, err)
	}
	return &localRepo{srv: srv, did: did, handle: handle}, nil
}

func (r *localRepo) DID() string { return r.did }

// ServiceAuth implements ServiceAuther with the account's key on the embedded PDS.
func (r *localRepo) ServiceAuth(ctx context.Context, aud, lxm string, ttl time.Duration) (string, error) {
	tok, err := r.srv.ServiceAuth(ctx, r.did, aud, lxm, ttl)
	return tok, localErr(err)
}
func (r *localRepo) Handle() string   { return r.handle }
func (r *localRepo) Endpoint() string { return r.srv.URL() }

// IsLocal says whether r is an account on the PDS of this process (Local).
func IsLocal(r Repo) bool {
	_, ok := r.(*localRepo)
	return ok
}

func (r *localRepo) Get(ctx context.Context, collection, rkey string) (*Record, error) {
	rec, err := r.srv.Repo(r.did).Get(ctx, collection, rkey)
	if err != nil {
		return nil, localErr(err)
	}
	return &Record{URI: rec.URI, CID: rec.CID, Value: rec.Value}, nil
}

func (r *localRepo) Put(ctx context.Context, collection, rkey string, value json.RawMessage, swapCID *string) (*WriteResult, error) {
	m, err := decodeObject(value)
	if err != nil {
		return nil, err
	}
	c, res, err := r.srv.Repo(r.did).Put(ctx, collection, rkey, m, localSwap(swapCID))
	if err != nil {
		return nil, localErr(err)
	}
	return &WriteResult{URI: res.URI, CID: res.CID, Changed: c != nil}, nil
}

// decodeObject parses a record as a JSON object, keeping numbers exact.
func decodeObject(value json.RawMessage) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil || m == nil {
		return nil, fmt.Errorf("%w: not a JSON object", ErrInvalidRecord)
	}
	return m, nil
}

func (r *localRepo) Delete(ctx context.Context, collection, rkey string, swapCID *string) error {
	_, err := r.srv.Repo(r.did).Delete(ctx, collection, rkey, localSwap(swapCID))
	return localErr(err)
}

func (r *localRepo) List(ctx context.Context, collection, cursor string, limit int) ([]Record, string, error) {
	recs, next, err := r.srv.Repo(r.did).List(ctx, collection, limit, cursor, true)
	if err != nil {
		return nil, "", localErr(err)
	}
	out := make([]Record, len(recs))
	for i, rec := range recs {
		out[i] = Record{URI: rec.URI, CID: rec.CID, Value: rec.Value}
	}
	return out, next, nil
}

func (r *localRepo) Events() EventSource { return localEvents{r.srv} }

type localEvents struct{ srv *pds.Server }

// LocalFirehose is the firehose of the embedded PDS srv, in-process.
func LocalFirehose(srv *pds.Server) EventSource { return localEvents{srv} }

func (l localEvents) Subscribe(ctx context.Context, cursor *int64, fn func(Event) error) error {
	return l.srv.Subscribe(ctx, cursor, func(ev *firehose.Event) error { return fn(fromFirehose(ev)) })
}

// Head is the seq of the embedded PDS's newest event.
func (l localEvents) Head(context.Context) (int64, error) { return l.srv.LastSeq(), nil }

func localSwap(s *string) *pds.Swap {
	if s == nil {
		return nil
	}
	return &pds.Swap{CID: *s}
}

// localErr maps the PDS's XRPC errors to the package's typed errors.
func localErr(err error) error {
	if err == nil {
		return nil
	}
	var xe *pds.XRPCError
	if !errors.As(err, &xe) {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return mapXRPC(xe.Name, xe.Status, err)
}

// mapXRPC maps an XRPC error name (the same on every PDS) to a typed error.
func mapXRPC(name string, status int, err error) error {
	switch name {
	case "InvalidSwap":
		return fmt.Errorf("%w: %v", ErrSwapMismatch, err)
	case "RecordNotFound":
		return fmt.Errorf("%w: %v", ErrNotFound, err)
	case "InvalidRecord", "PayloadTooLarge", "PayloadTooLargeError", "InvalidRequest":
		return fmt.Errorf("%w: %v", ErrInvalidRecord, err)
	case "RepoNotFound", "AccountTakedown", "AccountDeactivated":
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	case "AuthenticationRequired", "InvalidToken", "ExpiredToken", "AuthMissing":
		return fmt.Errorf("%w: %v", ErrLoginFailed, err)
	}
	if status >= 500 || status == 0 {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return err
}
