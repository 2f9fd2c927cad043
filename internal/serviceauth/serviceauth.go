// Package serviceauth verifies atproto inter-service auth tokens (the JWTs a PDS mints with
// com.atproto.server.getServiceAuth): signature against the issuer DID's #atproto key, audience
// in an allowed set, lexicon method (lxm), exp/iat with a small leeway, and a jti that has not
// been seen before within the token's lifetime.
//
// indigo's atproto/auth checks the signature, one audience and lxm; it keeps no memory of
// tokens, so a captured token could be replayed until it expires. This package adds the jti
// replay cache, an audience set (the gateway answers to more than one DID) and a cap on token
// lifetime, which also bounds the cache.
package serviceauth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	_ "github.com/bluesky-social/indigo/atproto/auth" // registers the ES256K and ES256 JWT methods
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
)

// Error is a refused token. Name is the XRPC error name the reference implementation uses;
// every refusal is HTTP 401.
type Error struct {
	Name    string
	Message string
}

func (e *Error) Error() string { return e.Name + ": " + e.Message }

func refuse(name, format string, args ...any) *Error {
	return &Error{Name: name, Message: fmt.Sprintf(format, args...)}
}

// Config configures a Verifier.
type Config struct {
	// Directory resolves the issuer DID to its #atproto key.
	Directory identity.Directory
	// Audiences are the aud values accepted (service DIDs, optionally with a #fragment).
	Audiences []string
	// Leeway allowed on exp and iat; default 5 s.
	Leeway time.Duration
	// MaxLifetime is the longest exp-iat accepted; default 1 h (getServiceAuth's limit).
	MaxLifetime time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Claims are the verified contents of a token.
type Claims struct {
	Issuer    syntax.DID
	Audience  string
	LexMethod string
	ID        string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// Verifier checks tokens. It is safe for concurrent use.
type Verifier struct {
	cfg       Config
	mu        sync.Mutex
	seen      map[string]time.Time // issuer + " " + jti -> expiry
	lastSweep time.Time            // when seen was last swept of expired entries

	keysMu sync.Mutex
	keys   map[identity.VerificationMethod]atcrypto.PublicKey // parsed #atproto keys
}

// maxKeys bounds the parsed-key cache; past it the cache starts over.
const maxKeys = 10000

// sweepEvery is how often the replay cache is swept of expired entries: a sweep walks the
// whole cache, so it is not done on every call.
const sweepEvery = time.Second

// publicKey is the issuer's #atproto key, parsed once per key: the DID document comes from
// the directory's cache, and the parsed key from this one, keyed by the key as the document
// states it, so a rotated key is a new entry and never served stale.
func (v *Verifier) publicKey(ident *identity.Identity) (atcrypto.PublicKey, error) {
	vm, ok := ident.Keys["atproto"]
	if !ok {
		return ident.PublicKey()
	}
	v.keysMu.Lock()
	pub, hit := v.keys[vm]
	v.keysMu.Unlock()
	if hit {
		return pub, nil
	}
	pub, err := ident.PublicKey()
	if err != nil {
		return nil, err
	}
	v.keysMu.Lock()
	if v.keys == nil || len(v.keys) >= maxKeys {
		v.keys = map[identity.VerificationMethod]atcrypto.PublicKey{}
	}
	v.keys[vm] = pub
	v.keysMu.Unlock()
	return pub, nil
}

// New returns a Verifier.
func New(cfg Config) *Verifier {
	if cfg.Leeway == 0 {
		cfg.Leeway = 5 * time.Second
	}
	if cfg.MaxLifetime == 0 {
		cfg.MaxLifetime = time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Verifier{cfg: cfg, seen: map[string]time.Time{}}
}

type claims struct {
	jwt.RegisteredClaims
	LexMethod string `json:"lxm,omitempty"`
}

// Verify checks token for a call of the lexicon method lxm ("" accepts any lxm, including
// none) and records its jti. The token is accepted at most once.
func (v *Verifier) Verify(ctx context.Context, token, lxm string) (*Claims, error) {
	c, err := v.check(ctx, token, lxm, false)
	if err != nil {
		var sigErr *Error
		if errors.As(err, &sigErr) && sigErr.Name == "BadJwtSignature" {
			// The key may have rotated since the directory cached it: look it up afresh once.
			if iss := unverifiedIssuer(token); iss != "" {
				_ = v.cfg.Directory.Purge(ctx, iss.AtIdentifier())
				c, err = v.check(ctx, token, lxm, true)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	now := v.cfg.Now()
	key := c.Issuer.String() + " " + c.ID
	v.mu.Lock()
	defer v.mu.Unlock()
	if now.Sub(v.lastSweep) >= sweepEvery || now.Before(v.lastSweep) {
		for k, exp := range v.seen {
			if now.After(exp.Add(v.cfg.Leeway)) {
				delete(v.seen, k)
			}
		}
		v.lastSweep = now
	}
	if _, dup := v.seen[key]; dup {
		return nil, refuse("JwtReplayed", "token was already used (jti %s)", c.ID)
	}
	v.seen[key] = c.ExpiresAt
	return c, nil
}

func unverifiedIssuer(token string) syntax.DID {
	var cl claims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &cl); err != nil {
		return ""
	}
	did, err := syntax.ParseDID(cl.Issuer)
	if err != nil {
		return ""
	}
	return did
}

func (v *Verifier) check(ctx context.Context, token, lxm string, _ bool) (*Claims, error) {
	if strings.Count(token, ".") != 2 || len(token) > 8192 {
		return nil, refuse("BadJwt", "poorly formatted jwt")
	}
	var cl claims
	parser := jwt.NewParser(
		jwt.WithValidMethods([]string{"ES256K", "ES256"}),
		jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(v.cfg.Leeway),
		jwt.WithTimeFunc(v.cfg.Now),
	)
	var keyErr error
	_, err := parser.ParseWithClaims(token, &cl, func(t *jwt.Token) (any, error) {
		did, err := syntax.ParseDID(cl.Issuer)
		if err != nil {
			keyErr = refuse("BadJwtIss", "iss is not a DID")
			return nil, keyErr
		}
		ident, err := v.cfg.Directory.LookupDID(ctx, did)
		if err != nil {
			keyErr = refuse("BadJwtIss", "could not resolve iss %s: %v", did, err)
			return nil, keyErr
		}
		pub, err := v.publicKey(ident)
		if err != nil {
			keyErr = refuse("BadJwtIss", "iss %s has no #atproto key: %v", did, err)
			return nil, keyErr
		}
		return pub, nil
	})
	switch {
	case keyErr != nil:
		return nil, keyErr
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, refuse("JwtExpired", "jwt expired")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return nil, refuse("BadJwtSignature", "jwt signature does not match jwt issuer")
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return nil, refuse("BadJwt", "jwt issued in the future")
	case err != nil:
		return nil, refuse("BadJwt", "%v", err)
	}
	aud := ""
	if len(cl.Audience) == 1 {
		aud = cl.Audience[0]
	}
	if !slices.Contains(v.cfg.Audiences, aud) {
		return nil, refuse("BadJwtAudience", "jwt audience does not match service did")
	}
	if lxm != "" && cl.LexMethod != lxm {
		if cl.LexMethod == "" {
			return nil, refuse("BadJwtLexiconMethod", "missing jwt lexicon method (\"lxm\")")
		}
		return nil, refuse("BadJwtLexiconMethod", "bad jwt lexicon method (\"lxm\"). must match: %s", lxm)
	}
	if cl.ID == "" {
		return nil, refuse("BadJwt", "missing jti")
	}
	if cl.IssuedAt == nil {
		return nil, refuse("BadJwt", "missing iat")
	}
	iat, exp := cl.IssuedAt.Time, cl.ExpiresAt.Time
	if exp.Sub(iat) > v.cfg.MaxLifetime+v.cfg.Leeway {
		return nil, refuse("BadJwt", "jwt lifetime %s exceeds %s", exp.Sub(iat), v.cfg.MaxLifetime)
	}
	return &Claims{Issuer: syntax.DID(cl.Issuer), Audience: aud, LexMethod: cl.LexMethod, ID: cl.ID,
		IssuedAt: iat, ExpiresAt: exp}, nil
}
