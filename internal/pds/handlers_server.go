package pds

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/serviceauth"
	"socialweb.computer/internal/xrpc"
)

func (s *Server) hDescribeServer(ctx context.Context, r *http.Request) (any, error) {
	return map[string]any{"did": s.cfg.ServiceDID, "availableUserDomains": s.cfg.UserDomains,
		"inviteCodeRequired": s.InvitesRequired(), "links": map[string]any{}, "contact": map[string]any{}}, nil
}

func (s *Server) sessionOut(acct *account, access, refresh string) map[string]any {
	active, status := acct.status()
	out := map[string]any{"did": acct.DID, "handle": acct.Handle, "accessJwt": access, "refreshJwt": refresh, "active": active}
	if status != "" {
		out["status"] = status
	}
	if data, err := s.plc.Data(context.Background(), acct.DID); err == nil {
		out["didDoc"] = data.Document()
	}
	if acct.Email != "" {
		out["email"] = acct.Email
		out["emailConfirmed"] = false
	}
	return out
}

// nsidCreateAccount is the lxm a service-auth token for createAccount must name.
const nsidCreateAccount = "com.atproto.server.createAccount"

// hCreateAccount is the reference's createAccount. With a service-auth token from the old PDS
// (getServiceAuth, aud this server's DID, lxm createAccount), whose issuer is the given did,
// an account brings its DID here: the first step of a migration (newAccount.DID).
func (s *Server) hCreateAccount(ctx context.Context, r *http.Request) (any, error) {
	requester, err := s.serviceAuthOptional(ctx, r, nsidCreateAccount)
	if err != nil {
		return nil, err
	}
	var in struct {
		Handle     *string         `json:"handle"`
		Password   string          `json:"password"`
		Email      string          `json:"email"`
		InviteCode string          `json:"inviteCode"`
		DID        *string         `json:"did"`
		PlcOp      json.RawMessage `json:"plcOp"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	if in.Handle == nil {
		return nil, errInvalidRequest("Missing required key \"handle\" at $")
	}
	if present(in.PlcOp) {
		return nil, errInvalidRequest("Unsupported input: \"plcOp\"")
	}
	did := ""
	if in.DID != nil {
		if _, err := syntax.ParseDID(*in.DID); err != nil {
			return nil, errInvalidRequest("Invalid DID (got %q) at $.did", *in.DID)
		}
		did = *in.DID
	}
	// The reference refuses a missing code before it looks at the handle, and a spent one
	// after; spendInvite checks again inside the account's transaction.
	invite := ""
	if s.InvitesRequired() && in.InviteCode == "" {
		return nil, errInvite("No invite code provided")
	}
	handle, err := s.checkNewHandle(ctx, *in.Handle, did, false)
	if err != nil {
		return nil, err
	}
	if s.InvitesRequired() {
		if err := s.checkInvite(in.InviteCode); err != nil {
			return nil, err
		}
		invite = in.InviteCode
	}
	// As the reference, a handle held here is named before a DID brought without its token
	// (createAccount checks again under the accounts' lock).
	if held, _ := s.resolveHandleLocal(handle); held != "" {
		return nil, errInvalidRequest("Handle already taken: %s", handle)
	}
	if did != "" && did != requester {
		return nil, errNamed(401, "AuthenticationRequired", "Missing auth to create account with did: %s", did)
	}
	acct, err := s.createAccount(ctx, newAccount{Handle: handle, Password: in.Password, Email: in.Email, Invite: invite, DID: did})
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	out := s.sessionOut(acct, access, refresh)
	delete(out, "active")
	delete(out, "status")
	delete(out, "email")
	delete(out, "emailConfirmed")
	return out, nil
}

// serviceAuthOptional is the reference's userServiceAuthOptional: without an Authorization
// header the caller is anonymous (""); a Bearer token must be a service-auth token for lxm
// addressed to this server, signed by its issuer's key (serviceauth.Verifier: once only),
// and the issuer is returned; anything else is refused.
func (s *Server) serviceAuthOptional(ctx context.Context, r *http.Request, lxm string) (string, error) {
	authz := r.Header.Get("Authorization")
	if authz == "" {
		return "", nil
	}
	tok, err := xrpc.BearerToken(authz)
	if err != nil {
		return "", errNamed(401, "AuthenticationRequired", "Invalid authorization header")
	}
	c, err := s.svcAuth.Verify(ctx, tok, lxm)
	if err != nil {
		var se *serviceauth.Error
		if errors.As(err, &se) {
			return "", errNamed(401, se.Name, "%s", se.Message)
		}
		return "", err
	}
	return c.Issuer.String(), nil
}

func (s *Server) hCreateSession(ctx context.Context, r *http.Request) (any, error) {
	var in struct {
		Identifier string `json:"identifier"`
		Password   string `json:"password"`
	}
	if err := decodeInput(r, &in); err != nil {
		return nil, err
	}
	// Every attempt counts, good or bad, before the password is looked at (as the
	// reference's rate limiter runs before its handler).
	now := time.Now()
	st := s.logins.take(s.loginKey(in.Identifier), clientIP(r), now)
	st.setHeaders(respHeader(ctx), now)
	if !st.allowed {
		s.log.Warn("createSession rate-limited", "identifier", in.Identifier, "ip", clientIP(r))
		return nil, errRateLimited()
	}
	acct, err := s.checkPassword(in.Identifier, in.Password)
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	return s.sessionOut(acct, access, refresh), nil
}

func (s *Server) accountOf(did string) (*account, error) {
	var acct *account
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		acct, err = getAccount(tx, did)
		return err
	})
	return acct, err
}

func (s *Server) hRefreshSession(ctx context.Context, r *http.Request) (any, error) {
	c, err := s.parseToken(r.Header.Get("Authorization"), scopeRefresh)
	if err != nil {
		return nil, err
	}
	found, err := s.revokeRefresh(c.ID)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errNamed(400, "ExpiredToken", "Token has been revoked")
	}
	acct, err := s.accountOf(c.Subject)
	if err != nil {
		return nil, err
	}
	access, refresh, err := s.issueSession(acct.DID)
	if err != nil {
		return nil, err
	}
	return s.sessionOut(acct, access, refresh), nil
}

func (s *Server) hGetSession(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	acct, err := s.accountOf(did)
	if err != nil {
		return nil, err
	}
	out := s.sessionOut(acct, "", "")
	delete(out, "accessJwt")
	delete(out, "refreshJwt")
	return out, nil
}

func (s *Server) hDeleteSession(ctx context.Context, r *http.Request) (any, error) {
	c, err := s.parseToken(r.Header.Get("Authorization"), scopeRefresh)
	if err != nil {
		return nil, err
	}
	if _, err := s.revokeRefresh(c.ID); err != nil {
		return nil, err
	}
	return map[string]any{}, nil
}

func (s *Server) hGetServiceAuth(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	p, err := queryParams(r, "com.atproto.server.getServiceAuth", "aud")
	if err != nil {
		return nil, err
	}
	if _, err := syntax.ParseDID(strings.SplitN(p["aud"], "#", 2)[0]); err != nil {
		return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Invalid DID (got %q)", p["aud"])
	}
	ttl := 60 * time.Second
	if v := p["exp"]; v != "" {
		exp, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Expected integer value type at $.exp")
		}
		d := time.Until(time.Unix(exp, 0))
		if d > time.Hour {
			return nil, errNamed(400, "BadExpiration", "cannot request a token with an expiration more than an hour in the future")
		}
		if d <= 0 {
			return nil, errNamed(400, "BadExpiration", "expiration is in past")
		}
		ttl = d
	}
	var lxm *syntax.NSID
	if v := p["lxm"]; v != "" {
		n, err := syntax.ParseNSID(v)
		if err != nil {
			return nil, errInvalidRequest("Invalid com.atproto.server.getServiceAuth params: Invalid NSID (got %q)", v)
		}
		lxm = &n
	}
	tok, err := s.signServiceAuth(did, p["aud"], ttl, lxm)
	if err != nil {
		return nil, err
	}
	return map[string]string{"token": tok}, nil
}

func (s *Server) signServiceAuth(did, aud string, ttl time.Duration, lxm *syntax.NSID) (string, error) {
	acct, err := s.accountOf(did)
	if err != nil {
		return "", err
	}
	key, err := atcrypto.ParsePrivateBytesK256(acct.SigningKey)
	if err != nil {
		return "", err
	}
	return auth.SignServiceAuth(syntax.DID(did), aud, ttl, lxm, key)
}

// ServiceAuth mints the service-auth token getServiceAuth would give the hosted account did,
// for an in-process caller: aud a DID (optionally with a #fragment), lxm an NSID or "", ttl
// up to an hour.
func (s *Server) ServiceAuth(_ context.Context, did, aud, lxm string, ttl time.Duration) (string, error) {
	if _, err := syntax.ParseDID(strings.SplitN(aud, "#", 2)[0]); err != nil {
		return "", errInvalidRequest("service auth: invalid aud DID %q", aud)
	}
	if ttl <= 0 || ttl > time.Hour {
		return "", errNamed(400, "BadExpiration", "service auth: ttl %s outside (0, 1h]", ttl)
	}
	var nsid *syntax.NSID
	if lxm != "" {
		n, err := syntax.ParseNSID(lxm)
		if err != nil {
			return "", errInvalidRequest("service auth: invalid lxm NSID %q", lxm)
		}
		nsid = &n
	}
	return s.signServiceAuth(did, aud, ttl, nsid)
}

func decodeAccount(v []byte) (*account, error) {
	var a account
	err := json.Unmarshal(v, &a)
	return &a, err
}
