package pds

import (
	"context"
	"io"
	"net/http"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
)

func (s *Server) hResolveHandle(ctx context.Context, r *http.Request) (any, error) {
	p, err := queryParams(r, "com.atproto.identity.resolveHandle", "handle")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseHandle(p["handle"]); err != nil {
		return nil, errInvalidRequest("Invalid com.atproto.identity.resolveHandle params: Invalid handle (got %q)", p["handle"])
	}
	did, _ := s.resolveHandleLocal(p["handle"])
	if did == "" {
		return nil, errNamed(400, "HandleNotFound", "Unable to resolve handle")
	}
	return map[string]string{"did": did}, nil
}

func (s *Server) hWellKnownDID(w http.ResponseWriter, r *http.Request) {
	did, _ := s.resolveHandleLocal(hostOnly(r.Host))
	if did == "" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(404)
		_, _ = io.WriteString(w, "User not found")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, did)
}

// emitIdentity appends an #identity event for did.
func (s *Server) emitIdentity(did, handle string) error {
	return s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		seq, err := nextSeq()
		if err != nil {
			return nil, err
		}
		h := handle
		b, err := firehose.Encode(firehose.TypeIdentity, &comatproto.SyncSubscribeRepos_Identity{Did: did, Handle: &h, Seq: seq, Time: nowString()})
		if err != nil {
			return nil, err
		}
		return []storedFrame{{seq: seq, typ: firehose.TypeIdentity, data: b}}, nil
	})
}
