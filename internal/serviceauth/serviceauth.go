// Package serviceauth verifies atproto inter-service auth tokens (the JWTs a PDS mints with
// com.atproto.server.getServiceAuth): signature against the issuer DID's #atproto key, audience
// in an allowed set, lexicon method (lxm), exp/iat with a small leeway, and a jti that has not
// been seen before within the token's lifetime.
//
// indigo's atproto/auth checks the signature, one audience and lxm; it keeps no memory of
// tokens, so a captured token could be replayed until it expires. This package adds the jti
// replay cache, an audience set (the gateway answers to more than one DID) and a cap on token
// lifetime, which also bounds the cache.
//
// A token whose signature fails against the cached key makes the verifier look the issuer's
// DID document up afresh (the key may have rotated), but at most once per RefetchInterval per
// DID and within a global RefetchRate: a stream of forged tokens costs the directory a
// bounded number of fetches, not one each.
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
	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"
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
	// RefetchInterval is the least time between two fresh look-ups of one DID's document
	// after bad signatures; default DefaultRefetchInterval. A key rotated within it is
	// accepted once it has passed.
	RefetchInterval time.Duration
	// RefetchRate and RefetchBurst bound fresh look-ups after bad signatures across all DIDs;
	// defaults DefaultRefetchRate and DefaultRefetchBurst.
	RefetchRate  rate.Limit
	RefetchBurst int
}

// Defaults of the refetch bound: a DID at most every 30 s, all DIDs together 2 a second
// with bursts of 20.
const (
	DefaultRefetchInterval = 30 * time.Second
	DefaultRefetchRate     = rate.Limit(2)
	DefaultRefetchBurst    = 20
)

// maxRefetchDIDs bounds the memory of when each DID was last refetched; past it the least
// recently refetched DID is forgotten (and may be refetched at once, within the global rate).
const maxRefetchDIDs = 10000

// CachingDirectory is dir behind a cache, unless it already is an identity.CacheDirectory.
// A verifier should be given one: the refetch bound limits look-ups after bad signatures, and
// with a directory that does not cache every call is a look-up.
func CachingDirectory(dir identity.Directory) identity.Directory {
	if _, ok := dir.(*identity.CacheDirectory); ok {
		return dir
	}
	return identity.NewCacheDirectory(dir, 100_000, time.Hour, time.Minute, time.Minute)
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

	refetchMu   sync.Mutex
	refetched   *lru.Cache[syntax.DID, time.Time] // DID -> when its document was last refetched
	refetchRate *rate.Limiter
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
	if cfg.RefetchInterval == 0 {
		cfg.RefetchInterval = DefaultRefetchInterval
	}
	if cfg.RefetchRate == 0 {
		cfg.RefetchRate = DefaultRefetchRate
	}
	if cfg.RefetchBurst == 0 {
		cfg.RefetchBurst = DefaultRefetchBurst
	}
	refetched, _ := lru.New[syntax.DID, time.Time](maxRefetchDIDs)
	return &Verifier{cfg: cfg, seen: map[string]time.Time{}, refetched: refetched,
		refetchRate: rate.NewLimiter(cfg.RefetchRate, cfg.RefetchBurst)}
}

// mayRefetch says whether did's document may be looked up afresh now, and if so counts it:
// not within RefetchInterval of its last refetch, and not past the global rate. A DID held
// back by its own interval takes nothing from the global budget.
func (v *Verifier) mayRefetch(did syntax.DID) bool {
	now := v.cfg.Now()
	v.refetchMu.Lock()
	defer v.refetchMu.Unlock()
	if last, ok := v.refetched.Get(did); ok && now.Sub(last) < v.cfg.RefetchInterval && !now.Before(last) {
		return false
	}
	if !v.refetchRate.AllowN(now, 1) {
		return false
	}
	v.refetched.Add(did, now)
	return true
}

type claims struct {
	jwt.RegisteredClaims
	LexMethod string `json:"lxm,omitempty"`
}

// Verify checks token for a call of the lexicon method lxm ("" accepts any lxm, including
// none) and records its jti. The token is accepted at most once.
func (v *Verifier) Verify(ctx context.Context, token, lxm string) (*Claims, error) {
	if strings.Count(token, ".") != 2 || len(token) > 8192 {
		return nil, refuse("BadJwt", "poorly formatted jwt")
	}
	// Read once without verifying: the header's type, and the issuer whose key a bad
	// signature makes look up afresh.
	var unverified claims
	t, _, err := jwt.NewParser().ParseUnverified(token, &unverified)
	if err == nil {
		// Session and proof tokens are never service-auth tokens, whatever they carry (the
		// reference refuses these types by name before anything else).
		if typ, _ := t.Header["typ"].(string); typ == "at+jwt" || typ == "refresh+jwt" || typ == "dpop+jwt" {
			return nil, refuse("BadJwtType", "Invalid jwt type %q", typ)
		}
	}
	c, err := v.check(ctx, token, lxm)
	if sigErr := (*Error)(nil); errors.As(err, &sigErr) && sigErr.Name == "BadJwtSignature" {
		// The key may have rotated since the directory cached it: look it up afresh, once
		// and only if the refetch bound allows it (else the refusal stands).
		if iss, perr := syntax.ParseDID(unverified.Issuer); perr == nil && v.mayRefetch(iss) {
			_ = v.cfg.Directory.Purge(ctx, iss.AtIdentifier())
			c, err = v.check(ctx, token, lxm)
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

// check verifies token's signature, times, audience and lexicon method.
func (v *Verifier) check(ctx context.Context, token, lxm string) (*Claims, error) {
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
			return nil, refuse("BadJwtLexiconMethod", "missing jwt lexicon method (\"lxm\"). must match: %s", lxm)
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
