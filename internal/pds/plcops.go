package pds

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/plc"
)

// The PLC operation endpoints let an account change its DID document through this server, the
// way an account moves to another PDS: getRecommendedDidCredentials says what a document naming
// this server holds, signPlcOperation signs an operation with the server's rotation key (only
// with a token, as the reference's email confirmation), submitPlcOperation sends a signed
// operation to the directory once it still names this server.

const purposePLCOperation = "plc_operation"

// pdsServiceType is the type of the #atproto_pds service.
const pdsServiceType = "AtprotoPersonalDataServer"

// issueAccountToken makes (replacing any earlier one) the token of purpose for did, good for
// 15 minutes.
func (s *Server) issueAccountToken(did, purpose string) (string, error) {
	tok := newAccountToken()
	raw, _ := json.Marshal(accountToken{Token: tok, RequestedAt: s.now().UTC()})
	err := s.db.Update(func(tx *bolt.Tx) error {
		if _, err := getAccount(tx, did); err != nil {
			return errInvalidRequest("account not found")
		}
		return tx.Bucket(bTokens).Put(repoKey(did, []byte(purpose)), raw)
	})
	return tok, err
}

// consumeAccountToken checks token against did's token of purpose and deletes it, as the
// reference's assertValidEmailTokenAndCleanup: tokens compare without regard to case, an
// expired one is refused (and kept, as there), a used one is gone.
func (s *Server) consumeAccountToken(did, purpose, token string) error {
	key := repoKey(did, []byte(purpose))
	return s.db.Update(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bTokens).Get(key)
		var tok accountToken
		if raw == nil || json.Unmarshal(raw, &tok) != nil ||
			subtle.ConstantTimeCompare([]byte(tok.Token), []byte(strings.ToUpper(token))) != 1 {
			return errNamed(400, "InvalidToken", "Token is invalid")
		}
		if s.now().Sub(tok.RequestedAt) > deleteTokenTTL {
			return errNamed(400, "ExpiredToken", "Token is expired")
		}
		return tx.Bucket(bTokens).Delete(key)
	})
}

// RequestPLCOperationSignature makes (replacing any earlier one) the token signPlcOperation asks
// for, good for 15 minutes. The reference mails it to the account's email address; this server
// sends no email, so the in-process caller (the operator) hands it over.
func (s *Server) RequestPLCOperationSignature(_ context.Context, did string) (string, error) {
	return s.issueAccountToken(did, purposePLCOperation)
}

func (s *Server) hRequestPlcOperationSignature(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	acct, err := s.accountOf(did)
	if err != nil {
		return nil, errInvalidRequest("account not found")
	}
	if acct.Email == "" {
		return nil, errInvalidRequest("account does not have an email address")
	}
	return nil, errInvalidRequest("this server sends no email: ask its operator for a PLC operation token")
}

func signingDIDKey(acct *account) (string, error) {
	key, err := atcrypto.ParsePrivateBytesK256(acct.SigningKey)
	if err != nil {
		return "", err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return "", err
	}
	return pub.DIDKey(), nil
}

// DIDCredentials is what getRecommendedDidCredentials answers: the DID document fields that
// make this server the account's PDS.
type DIDCredentials struct {
	AlsoKnownAs         []string               `json:"alsoKnownAs,omitempty"`
	VerificationMethods map[string]string      `json:"verificationMethods"`
	RotationKeys        []string               `json:"rotationKeys"`
	Services            map[string]plc.Service `json:"services"`
}

// RecommendedDIDCredentials is the reference's getRecommendedDidCredentials: the account's
// handle, its signing key, the server's rotation key and this server as #atproto_pds.
func (s *Server) RecommendedDIDCredentials(_ context.Context, did string) (*DIDCredentials, error) {
	acct, err := s.accountOf(did)
	if err != nil {
		return nil, err
	}
	sig, err := signingDIDKey(acct)
	if err != nil {
		return nil, err
	}
	rot, err := s.rotationKey.PublicKey()
	if err != nil {
		return nil, err
	}
	out := &DIDCredentials{
		VerificationMethods: map[string]string{"atproto": sig},
		RotationKeys:        []string{rot.DIDKey()},
		Services:            map[string]plc.Service{"atproto_pds": {Type: pdsServiceType, Endpoint: s.url}},
	}
	if acct.Handle != "" {
		out.AlsoKnownAs = []string{"at://" + acct.Handle}
	}
	return out, nil
}

func (s *Server) hGetRecommendedDidCredentials(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	return s.RecommendedDIDCredentials(ctx, did)
}

// PLCOpFields are the fields signPlcOperation may set; nil keeps the current operation's.
type PLCOpFields struct {
	RotationKeys        []string
	AlsoKnownAs         []string
	VerificationMethods map[string]string
	Services            map[string]plc.Service
}

// mergeOp is the content of the operation that follows last: each field the caller gave
// replaces the current one whole, the others are kept, as the reference's signPlcOperation.
func mergeOp(last *plc.Op, in PLCOpFields) plc.Op {
	out := plc.Op{Type: plc.TypeOperation, RotationKeys: last.RotationKeys, AlsoKnownAs: last.AlsoKnownAs,
		VerificationMethods: last.VerificationMethods, Services: last.Services}
	if in.RotationKeys != nil {
		out.RotationKeys = in.RotationKeys
	}
	if in.AlsoKnownAs != nil {
		out.AlsoKnownAs = in.AlsoKnownAs
	}
	if in.VerificationMethods != nil {
		out.VerificationMethods = in.VerificationMethods
	}
	if in.Services != nil {
		out.Services = in.Services
	}
	return out
}

// present reports whether a JSON value was given (absent and null are the same, as the
// reference's `??`).
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func (s *Server) hSignPlcOperation(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	var in struct {
		Token               *string         `json:"token"`
		RotationKeys        []string        `json:"rotationKeys"`
		AlsoKnownAs         []string        `json:"alsoKnownAs"`
		VerificationMethods json.RawMessage `json:"verificationMethods"`
		Services            json.RawMessage `json:"services"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	// The reference signs these unchecked; refusing a malformed one here keeps the token.
	f := PLCOpFields{RotationKeys: in.RotationKeys, AlsoKnownAs: in.AlsoKnownAs}
	if present(in.VerificationMethods) {
		if err := json.Unmarshal(in.VerificationMethods, &f.VerificationMethods); err != nil {
			return nil, errInvalidRequest("verificationMethods must map ids to did:key strings")
		}
	}
	if present(in.Services) {
		if err := json.Unmarshal(in.Services, &f.Services); err != nil {
			return nil, errInvalidRequest("services must map ids to {type, endpoint} objects")
		}
	}
	if in.Token == nil || *in.Token == "" {
		return nil, errInvalidRequest("email confirmation token required to sign PLC operations")
	}
	op, err := s.SignPLCOperation(ctx, did, *in.Token, f)
	if err != nil {
		return nil, err
	}
	return map[string]any{"operation": op}, nil
}

// SignPLCOperation spends did's PLC operation token and returns an operation following the
// DID's current one with the fields of in merged over it, signed with the server's rotation
// key. Nothing is submitted.
func (s *Server) SignPLCOperation(ctx context.Context, did, token string, in PLCOpFields) (*plc.Op, error) {
	if err := s.consumeAccountToken(did, purposePLCOperation, token); err != nil {
		return nil, err
	}
	last, err := s.plc.Last(ctx, did)
	if err != nil {
		return nil, errNamed(500, "InternalServerError", "reading the PLC log of %s: %v", did, err)
	}
	if last.Type == plc.TypeTombstone {
		return nil, errInvalidRequest("Did is tombstoned")
	}
	return plc.Next(s.rotationKey, last, mergeOp(last, in))
}

// parseSubmittedOp reads the operation submitPlcOperation is given, checking its shape as the
// reference's check.is(op, plc.def.operation) does: a plc_operation with every field.
func parseSubmittedOp(raw json.RawMessage) (*plc.Op, error) {
	var in struct {
		Type                *string                 `json:"type"`
		RotationKeys        *[]string               `json:"rotationKeys"`
		VerificationMethods *map[string]string      `json:"verificationMethods"`
		AlsoKnownAs         *[]string               `json:"alsoKnownAs"`
		Services            *map[string]plc.Service `json:"services"`
		Prev                json.RawMessage         `json:"prev"`
		Sig                 *string                 `json:"sig"`
	}
	bad := errInvalidRequest("Invalid operation")
	if !present(raw) || json.Unmarshal(raw, &in) != nil {
		return nil, bad
	}
	if in.Type == nil || *in.Type != plc.TypeOperation || in.RotationKeys == nil || in.VerificationMethods == nil ||
		in.AlsoKnownAs == nil || in.Services == nil || in.Sig == nil || len(in.Prev) == 0 {
		return nil, bad
	}
	op := &plc.Op{Type: plc.TypeOperation, RotationKeys: *in.RotationKeys, VerificationMethods: *in.VerificationMethods,
		AlsoKnownAs: *in.AlsoKnownAs, Services: *in.Services, Sig: *in.Sig}
	if present(in.Prev) {
		var prev string
		if json.Unmarshal(in.Prev, &prev) != nil {
			return nil, bad
		}
		op.Prev = &prev
	}
	for _, s := range op.Services {
		if s.Type == "" && s.Endpoint == "" {
			// {} or an object without the two fields: not a service.
			return nil, bad
		}
	}
	return op, nil
}

// submitExpect is what an operation submitted through this server must keep.
type submitExpect struct {
	RotationKey string // the server's
	Endpoint    string // the server's public URL
	SigningKey  string // the account's did:key
	Handle      string // the account's; empty: not checked
}

// checkSubmittedOp is the reference's submitPlcOperation check, in its order: the operation
// must keep the server's rotation key, name this server as #atproto_pds, keep the account's
// signing key and, first in alsoKnownAs, its handle. Otherwise the account would be left with
// a DID document that does not point at the server holding its repo.
func checkSubmittedOp(op *plc.Op, want submitExpect) error {
	if !slices.Contains(op.RotationKeys, want.RotationKey) {
		return errInvalidRequest("Rotation keys do not include server's rotation key")
	}
	svc, ok := op.Services["atproto_pds"]
	if !ok || svc.Type != pdsServiceType {
		return errInvalidRequest("Incorrect type on atproto_pds service")
	}
	if svc.Endpoint != want.Endpoint {
		return errInvalidRequest("Incorrect endpoint on atproto_pds service")
	}
	if op.VerificationMethods["atproto"] != want.SigningKey {
		return errInvalidRequest("Incorrect signing key")
	}
	if want.Handle != "" && (len(op.AlsoKnownAs) == 0 || op.AlsoKnownAs[0] != "at://"+want.Handle) {
		return errInvalidRequest("Incorrect handle in alsoKnownAs")
	}
	return nil
}

func (s *Server) hSubmitPlcOperation(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	var in struct {
		Operation json.RawMessage `json:"operation"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if len(in.Operation) == 0 {
		return nil, errInvalidRequest("Missing required key \"operation\" at $")
	}
	op, err := parseSubmittedOp(in.Operation)
	if err != nil {
		return nil, err
	}
	return nil, s.SubmitPLCOperation(ctx, did, op)
}

// SubmitPLCOperation checks op (checkSubmittedOp), sends it to the PLC directory, which checks
// its signature and prev, and emits #identity (without a handle, as the reference) so that
// relays and app views read the DID document again.
func (s *Server) SubmitPLCOperation(ctx context.Context, did string, op *plc.Op) error {
	acct, err := s.accountOf(did)
	if err != nil {
		return errInvalidRequest("account not found")
	}
	sig, err := signingDIDKey(acct)
	if err != nil {
		return err
	}
	rot, err := s.rotationKey.PublicKey()
	if err != nil {
		return err
	}
	if err := checkSubmittedOp(op, submitExpect{RotationKey: rot.DIDKey(), Endpoint: s.url, SigningKey: sig, Handle: acct.Handle}); err != nil {
		return err
	}
	if err := s.plc.Submit(ctx, did, op); err != nil {
		var pe *plc.Error
		if errors.As(err, &pe) && pe.Status/100 == 4 {
			return errInvalidRequest("the PLC directory refused the operation: %s", pe.Message)
		}
		return errNamed(502, "UpstreamFailure", "submitting to the PLC directory: %v", err)
	}
	return s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		var frames []storedFrame
		err := frameAdder(nextSeq, &frames)(firehose.TypeIdentity, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Identity{Did: did, Seq: seq, Time: nowString()}
		})
		return frames, err
	})
}
