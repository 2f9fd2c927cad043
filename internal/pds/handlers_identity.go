package pds

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/plc"
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

func (s *Server) hUpdateHandle(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	var in struct {
		Handle *string `json:"handle"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if in.Handle == nil {
		return nil, errInvalidRequest("Missing required key \"handle\" at $")
	}
	return nil, s.UpdateHandle(ctx, did, *in.Handle)
}

// UpdateHandle gives did a new handle, as the reference's updateHandle: the handle is
// validated as for a new account, except that one outside the server's domains is allowed
// when it resolves (DNS or /.well-known) to did. The DID document's alsoKnownAs is updated
// through the PLC directory first, then the handle index, then #identity is emitted. Setting
// the handle it already has does all of it again, which is how a lost #identity is re-sent.
func (s *Server) UpdateHandle(ctx context.Context, did, handle string) error {
	h, own, err := s.normalizeHandle(handle, false)
	if err != nil {
		return err
	}
	if !own {
		got, err := s.resolveExternalHandle(ctx, h)
		if err != nil || got != did {
			return errInvalidRequest("External handle did not resolve to DID")
		}
	}
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	if _, err := s.accountOf(did); err != nil {
		return errInvalidRequest("Account not found")
	}
	if other, _ := s.resolveHandleLocal(h); other != "" && other != did {
		return errNamed(400, "HandleNotAvailable", "Handle already taken: %s", h)
	}
	last, err := s.plc.Last(ctx, did)
	if err != nil {
		return errNamed(500, "InternalServerError", "reading the PLC log of %s: %v", did, err)
	}
	next := plc.Op{RotationKeys: last.RotationKeys, VerificationMethods: last.VerificationMethods,
		AlsoKnownAs: []string{"at://" + h}, Services: last.Services}
	// Other alsoKnownAs entries (not at:// handles) are kept, as the reference does.
	for _, aka := range last.AlsoKnownAs {
		if !strings.HasPrefix(aka, "at://") {
			next.AlsoKnownAs = append(next.AlsoKnownAs, aka)
		}
	}
	op, err := plc.Next(s.rotationKey, last, next)
	if err != nil {
		return err
	}
	if err := s.plc.Submit(ctx, did, op); err != nil {
		return errNamed(500, "InternalServerError", "updating the handle of %s with the PLC directory: %v", did, err)
	}
	return s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		acct, err := getAccount(tx, did)
		if err != nil {
			return nil, err
		}
		if acct.Handle != h {
			if err := tx.Bucket(bHandles).Delete([]byte(acct.Handle)); err != nil {
				return nil, err
			}
			if err := tx.Bucket(bHandles).Put([]byte(h), []byte(did)); err != nil {
				return nil, err
			}
			acct.Handle = h
			if err := putAccount(tx, acct); err != nil {
				return nil, err
			}
		}
		var frames []storedFrame
		add := frameAdder(nextSeq, &frames)
		if err := add(firehose.TypeIdentity, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Identity{Did: did, Handle: &h, Seq: seq, Time: nowString()}
		}); err != nil {
			return nil, err
		}
		return frames, nil
	})
}

// resolveExternalHandle resolves a handle outside the server's domains the way the network
// does (DNS TXT _atproto, then https://<handle>/.well-known/atproto-did).
func (s *Server) resolveExternalHandle(ctx context.Context, h string) (string, error) {
	hd, err := syntax.ParseHandle(h)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dir := identity.BaseDirectory{HTTPClient: http.Client{Timeout: 10 * time.Second}}
	did, err := dir.ResolveHandle(ctx, hd)
	return did.String(), err
}
