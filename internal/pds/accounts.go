package pds

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
	"github.com/ipfs/go-cid"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/crypto/bcrypt"

	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/xrpc"
)

// account is what the PDS keeps about one hosted account.
type account struct {
	DID          string    `json:"did"`
	Handle       string    `json:"handle"`
	Email        string    `json:"email,omitempty"`
	PasswordHash []byte    `json:"passwordHash"`
	SigningKey   []byte    `json:"signingKey"` // K256 private key bytes
	CreatedAt    time.Time `json:"createdAt"`
	Active       bool      `json:"active"`
	// DeactivatedAt is when deactivateAccount was called; nil while active.
	DeactivatedAt *time.Time `json:"deactivatedAt,omitempty"`
}

func getAccount(tx *bolt.Tx, did string) (*account, error) {
	raw := tx.Bucket(bAccounts).Get([]byte(did))
	if raw == nil {
		return nil, errRepoNotFound(did)
	}
	var a account
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	return &a, nil
}

// disallowedTLDs are the suffixes the reference refuses in any handle (@atproto/syntax
// DISALLOWED_TLDS); .test is allowed, as there, for testing.
var disallowedTLDs = []string{".local", ".arpa", ".invalid", ".localhost", ".internal", ".example", ".alt", ".onion"}

// normalizeHandle is the reference's normalizeAndValidateHandle up to the point where a
// handle outside the server's domains would have to be resolved: it reports whether the
// handle is under one of the server's own domains, and for those checks the first label.
func (s *Server) normalizeHandle(h string, allowReserved bool) (string, bool, error) {
	hd, err := syntax.ParseHandle(h)
	if err != nil {
		return "", false, errInvalidRequest("Invalid handle (got %q) at $.handle", h)
	}
	h = hd.Normalize().String()
	for _, tld := range disallowedTLDs {
		if strings.HasSuffix(h, tld) {
			return "", false, errNamed(400, "InvalidHandle", "Handle TLD is invalid or disallowed")
		}
	}
	domain := ""
	for _, d := range s.cfg.UserDomains {
		if strings.HasSuffix(h, d) {
			domain = d
		}
	}
	if domain == "" {
		return h, false, nil
	}
	front := strings.TrimSuffix(h, domain)
	if strings.Contains(front, ".") {
		return "", false, errNamed(400, "InvalidHandle", "Invalid characters in handle")
	}
	if len(front) < 3 {
		return "", false, errNamed(400, "InvalidHandle", "Handle too short")
	}
	if len(front) > 18 {
		return "", false, errNamed(400, "InvalidHandle", "Handle too long")
	}
	if !allowReserved && reservedSubdomains[front] {
		return "", false, errNamed(400, "HandleNotAvailable", "Reserved handle")
	}
	return h, true, nil
}

// checkNewHandle is the reference's normalizeAndValidateHandle for createAccount: a handle
// under one of the server's domains, or, for an account that brings its own DID (did not
// empty), any handle that resolves (DNS or /.well-known) to that DID. allowReserved lets the
// operator's in-process accounts take a reserved name (such as owner.test), as the reference
// lets its admin.
func (s *Server) checkNewHandle(ctx context.Context, h, did string, allowReserved bool) (string, error) {
	h, own, err := s.normalizeHandle(h, allowReserved)
	if err != nil || own {
		return h, err
	}
	if did == "" {
		return "", errNamed(400, "UnsupportedDomain", "Not a supported handle domain")
	}
	if got, err := s.resolveExternalHandle(ctx, h); err != nil || got != did {
		return "", errInvalidRequest("External handle did not resolve to DID")
	}
	return h, nil
}

// CreateAccount creates an account with a new did:plc, an empty signed repo, and the firehose
// events #identity, #account, #commit and #sync, as the reference PDS emits them. It is the
// in-process path (the operator's own accounts): it needs no invite code.
func (s *Server) CreateAccount(ctx context.Context, handle, password string) (string, error) {
	handle, err := s.checkNewHandle(ctx, handle, "", true)
	if err != nil {
		return "", err
	}
	acct, err := s.createAccount(ctx, newAccount{Handle: handle, Password: password})
	if err != nil {
		return "", err
	}
	return acct.DID, nil
}

// newAccount is what createAccount is given, the handle already checked.
type newAccount struct {
	Handle, Password, Email string
	// Invite, when set, is spent in the account's transaction.
	Invite string
	// DID, when set, is an identity the account brings from another PDS (a migration): no
	// PLC operation is made, and the account starts deactivated, with a signing key of its own
	// and an empty repo, and without firehose events, as the reference's. Its DID document
	// names this server only once the old PDS signs the operation getRecommendedDidCredentials
	// describes; activateAccount checks that.
	DID string
}

// createAccount makes the account.
func (s *Server) createAccount(ctx context.Context, in newAccount) (*account, error) {
	handle := in.Handle
	if in.Password == "" {
		return nil, errInvalidRequest("Password is required")
	}
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	if did, _ := s.resolveHandleLocal(handle); did != "" {
		return nil, errInvalidRequest("Handle already taken: %s", handle)
	}
	if in.DID != "" {
		if _, err := s.accountOf(in.DID); err == nil {
			return nil, errNamed(400, "AlreadyExists", "Repo already exists")
		}
	}
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return nil, err
	}
	did := in.DID
	if did == "" {
		if did, err = s.registerDID(ctx, key, handle); err != nil {
			return nil, err
		}
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(in.Password), bcrypt.DefaultCost)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	acct := &account{DID: did, Handle: handle, Email: in.Email, PasswordHash: hash, SigningKey: key.Bytes(),
		CreatedAt: now, Active: in.DID == ""}
	if !acct.Active {
		acct.DeactivatedAt = &now
	}

	rs := &repoState{did: did, key: key}
	rs.clock = syntax.NewTIDClock(0)
	empty := mst.NewEmptyTree()
	rs.tree = &empty
	rs.mu.Lock()
	defer rs.mu.Unlock()
	blocks := newMemBlocks()
	root, err := empty.WriteDiffBlocks(ctx, blocks)
	if err != nil {
		return nil, err
	}
	acctJSON, _ := json.Marshal(acct)
	// The account rows go into the same transaction as the genesis commit, through the
	// event callback, which runs inside it.
	_, err = s.commitRepoWith(ctx, rs, empty, *root, blocks, nil, func(tx *bolt.Tx, nextSeq func() (int64, error), commitCID cid.Cid, rev string, carBytes []byte, commitBlock []byte) ([]storedFrame, error) {
		if in.Invite != "" {
			if err := spendInvite(tx, in.Invite, did); err != nil {
				return nil, err
			}
		}
		if err := tx.Bucket(bAccounts).Put([]byte(did), acctJSON); err != nil {
			return nil, err
		}
		if err := tx.Bucket(bHandles).Put([]byte(handle), []byte(did)); err != nil {
			return nil, err
		}
		if !acct.Active {
			return nil, nil
		}
		var frames []storedFrame
		add := func(t string, mk func(seq int64) cborBody) error {
			seq, err := nextSeq()
			if err != nil {
				return err
			}
			b, err := firehose.Encode(t, mk(seq))
			if err != nil {
				return err
			}
			frames = append(frames, storedFrame{seq: seq, typ: t, data: b})
			return nil
		}
		now := nowString()
		h := handle
		if err := add(firehose.TypeIdentity, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Identity{Did: did, Handle: &h, Seq: seq, Time: now}
		}); err != nil {
			return nil, err
		}
		if err := add(firehose.TypeAccount, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Account{Did: did, Active: true, Seq: seq, Time: now}
		}); err != nil {
			return nil, err
		}
		if err := add(firehose.TypeCommit, func(seq int64) cborBody {
			return commitEvent(seq, did, commitCID, rev, nil, carBytes, nil, nil)
		}); err != nil {
			return nil, err
		}
		syncCAR, err := writeCAR(commitCID, []cid.Cid{commitCID}, func(cid.Cid) []byte { return commitBlock })
		if err != nil {
			return nil, err
		}
		if err := add(firehose.TypeSync, func(seq int64) cborBody {
			return &comatproto.SyncSubscribeRepos_Sync{Did: did, Blocks: syncCAR, Rev: rev, Seq: seq, Time: now}
		}); err != nil {
			return nil, err
		}
		return frames, nil
	})
	if err != nil {
		return nil, err
	}
	s.reposMu.Lock()
	s.repos[did] = rs
	s.reposMu.Unlock()
	if !acct.Active {
		s.log.Info("account created for an existing DID, deactivated until its DID document names this server", "did", did, "handle", handle)
		return acct, nil
	}
	s.log.Info("account created", "did", did, "handle", handle)
	s.crawl.notify()
	return acct, nil
}

// registerDID makes a new did:plc naming this server, key and handle, with the server's
// rotation key.
func (s *Server) registerDID(ctx context.Context, key *atcrypto.PrivateKeyK256, handle string) (string, error) {
	pub, err := key.PublicKey()
	if err != nil {
		return "", err
	}
	rotPub, err := s.rotationKey.PublicKey()
	if err != nil {
		return "", err
	}
	did, op, err := plc.Genesis(s.rotationKey, []string{rotPub.DIDKey()}, pub.DIDKey(), handle, s.URL())
	if err != nil {
		return "", err
	}
	if err := s.plc.Submit(ctx, did, op); err != nil {
		return "", errNamed(500, "InternalServerError", "registering %s with the PLC directory: %v", did, err)
	}
	return did, nil
}

// resolveHandleLocal looks a handle up among the hosted accounts.
func (s *Server) resolveHandleLocal(handle string) (string, error) {
	var did string
	err := s.db.View(func(tx *bolt.Tx) error {
		did = string(tx.Bucket(bHandles).Get([]byte(strings.ToLower(handle))))
		return nil
	})
	return did, err
}

// resolveRepo turns an at-identifier (DID or handle) into a hosted DID.
func (s *Server) resolveRepo(ident string) (string, *account, error) {
	id, err := syntax.ParseAtIdentifier(ident)
	if err != nil {
		return "", nil, errInvalidRequest("Invalid at-identifier (got %q)", ident)
	}
	did := ident
	if id.IsHandle() {
		d, err := s.resolveHandleLocal(ident)
		if err != nil {
			return "", nil, err
		}
		if d == "" {
			return "", nil, errInvalidRequest("Could not find repo: %s", ident)
		}
		did = d
	}
	var acct *account
	err = s.db.View(func(tx *bolt.Tx) error {
		var err error
		acct, err = getAccount(tx, did)
		return err
	})
	if err != nil {
		return "", nil, err
	}
	return did, acct, nil
}

// Sessions.

const (
	scopeAccess  = "com.atproto.access"
	scopeRefresh = "com.atproto.refresh"
	accessTTL    = 2 * time.Hour
	refreshTTL   = 90 * 24 * time.Hour
)

type sessionClaims struct {
	Scope string `json:"scope"`
	jwt.RegisteredClaims
}

type session struct {
	DID       string    `json:"did"`
	ExpiresAt time.Time `json:"expiresAt"`
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawStdEncoding.EncodeToString(b)
}

// issueSession mints an access/refresh pair and stores the refresh token's id.
func (s *Server) issueSession(did string) (access, refresh string, err error) {
	now := time.Now()
	at := jwt.NewWithClaims(jwt.SigningMethodHS256, sessionClaims{Scope: scopeAccess, RegisteredClaims: jwt.RegisteredClaims{
		Audience: jwt.ClaimStrings{s.cfg.ServiceDID}, Subject: did,
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(accessTTL)),
	}})
	at.Header["typ"] = "at+jwt"
	access, err = at.SignedString(s.jwtSecret)
	if err != nil {
		return "", "", err
	}
	jti := randomID()
	exp := now.Add(refreshTTL)
	rt := jwt.NewWithClaims(jwt.SigningMethodHS256, sessionClaims{Scope: scopeRefresh, RegisteredClaims: jwt.RegisteredClaims{
		Audience: jwt.ClaimStrings{s.cfg.ServiceDID}, Subject: did, ID: jti,
		IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(exp),
	}})
	rt.Header["typ"] = "refresh+jwt"
	refresh, err = rt.SignedString(s.jwtSecret)
	if err != nil {
		return "", "", err
	}
	raw, _ := json.Marshal(session{DID: did, ExpiresAt: exp})
	err = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bSessions).Put([]byte(jti), raw) })
	return access, refresh, err
}

// parseToken checks a session token of the given scope and returns its claims, with the
// reference PDS's error names.
func (s *Server) parseToken(authz, scope string) (*sessionClaims, error) {
	tok, err := xrpc.BearerToken(authz)
	if errors.Is(err, xrpc.ErrNoAuthorization) {
		return nil, errNamed(401, xrpc.AuthMissing, "Authentication Required")
	}
	if err != nil {
		return nil, errNamed(400, xrpc.InvalidToken, "Unexpected authorization type")
	}
	var claims sessionClaims
	_, err = jwt.ParseWithClaims(tok, &claims, func(t *jwt.Token) (any, error) { return s.jwtSecret, nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithAudience(s.cfg.ServiceDID))
	if errors.Is(err, jwt.ErrTokenExpired) {
		return nil, errNamed(400, "ExpiredToken", "Token has expired")
	}
	if err != nil {
		return nil, errNamed(400, "InvalidToken", "Token could not be verified")
	}
	if claims.Scope != scope {
		return nil, errNamed(400, "InvalidToken", "Bad token scope")
	}
	return &claims, nil
}

func (s *Server) revokeRefresh(jti string) (bool, error) {
	found := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bSessions)
		if b.Get([]byte(jti)) != nil {
			found = true
		}
		return b.Delete([]byte(jti))
	})
	return found, err
}

func (s *Server) checkPassword(identifier, password string) (*account, error) {
	ident := strings.ToLower(strings.TrimSpace(identifier))
	did := ident
	if !strings.HasPrefix(ident, "did:") {
		d, err := s.resolveHandleLocal(ident)
		if err != nil {
			return nil, err
		}
		did = d
	}
	var acct *account
	if did != "" {
		_ = s.db.View(func(tx *bolt.Tx) error {
			acct, _ = getAccount(tx, did)
			return nil
		})
	}
	if acct == nil || bcrypt.CompareHashAndPassword(acct.PasswordHash, []byte(password)) != nil {
		return nil, errNamed(401, "AuthenticationRequired", "Invalid identifier or password")
	}
	return acct, nil
}

// SetPassword replaces did's password and ends its sessions (every refresh token), as the
// reference PDS does on a password change: a password that leaked is then worth nothing,
// nor is a session opened with it. Access tokens already issued run out within accessTTL.
func (s *Server) SetPassword(_ context.Context, did, password string) error {
	if password == "" {
		return errInvalidRequest("Password is required")
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	s.acctMu.Lock()
	defer s.acctMu.Unlock()
	return s.db.Update(func(tx *bolt.Tx) error {
		acct, err := getAccount(tx, did)
		if err != nil {
			return err
		}
		acct.PasswordHash = hash
		raw, err := json.Marshal(acct)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bAccounts).Put([]byte(did), raw); err != nil {
			return err
		}
		sessions := tx.Bucket(bSessions)
		var ended [][]byte
		err = sessions.ForEach(func(k, v []byte) error {
			var ses session
			if json.Unmarshal(v, &ses) == nil && ses.DID == did {
				ended = append(ended, append([]byte(nil), k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range ended {
			if err := sessions.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
}
