package pds

import (
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
)

// LoginLimits bound createSession attempts, good or bad, as the reference PDS counts them: at
// most AccountPoints per account and IPPoints per client address in a fixed Window that opens
// at the first attempt.
type LoginLimits struct {
	AccountPoints int
	IPPoints      int
	Window        time.Duration
	// Keys is how many accounts and IPs are remembered each; the least recently seen is
	// forgotten past it.
	Keys int
}

// DefaultLoginLimits are the reference PDS's 30 attempts per 5 minutes for an account, and
// 100 per 5 minutes from one address across accounts (which bounds a guesser who spreads
// attempts over many accounts).
var DefaultLoginLimits = LoginLimits{AccountPoints: 30, IPPoints: 100, Window: 5 * time.Minute, Keys: 10000}

func (l LoginLimits) withDefaults() LoginLimits {
	d := DefaultLoginLimits
	if l.AccountPoints <= 0 {
		l.AccountPoints = d.AccountPoints
	}
	if l.IPPoints <= 0 {
		l.IPPoints = d.IPPoints
	}
	if l.Window <= 0 {
		l.Window = d.Window
	}
	if l.Keys <= 0 {
		l.Keys = d.Keys
	}
	return l
}

// keyedLimiter counts attempts per key in fixed windows, as the reference PDS's limiter
// (rate-limiter-flexible's memory limiter) does: a window opens at a key's first attempt and
// allows points attempts until it ends, whatever their spacing; the next attempt after it
// opens a new one. A token bucket would refill within the window and let a slow guesser
// past the reference's count.
type keyedLimiter struct {
	points int
	window time.Duration
	mu     sync.Mutex
	keys   *lru.Cache[string, *fixedWindow]
}

type fixedWindow struct {
	start time.Time
	used  int
}

func newKeyedLimiter(points int, window time.Duration, keys int) *keyedLimiter {
	c, _ := lru.New[string, *fixedWindow](keys)
	return &keyedLimiter{points: points, window: window, keys: c}
}

// limitStatus is one key after an attempt, in the terms of the RateLimit-* headers.
type limitStatus struct {
	limit, remaining int
	window           time.Duration
	next             time.Duration // until the window ends
	allowed          bool
}

func (k *keyedLimiter) take(key string, now time.Time) limitStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	w, ok := k.keys.Get(key)
	if !ok || now.Sub(w.start) >= k.window || now.Before(w.start) {
		w = &fixedWindow{start: now}
		k.keys.Add(key, w)
	}
	st := limitStatus{limit: k.points, window: k.window, next: w.start.Add(k.window).Sub(now)}
	if w.used < k.points {
		w.used++
		st.allowed = true
	}
	st.remaining = k.points - w.used
	return st
}

// loginKey is the account bucket an identifier counts against: a hosted handle's DID, so an
// account's handle and DID share one bucket; anything else as given, lower-cased.
func (s *Server) loginKey(identifier string) string {
	ident := strings.ToLower(strings.TrimSpace(identifier))
	if !strings.HasPrefix(ident, "did:") {
		if did, _ := s.resolveHandleLocal(ident); did != "" {
			return did
		}
	}
	return ident
}

// loginLimiter is createSession's pair of limits.
type loginLimiter struct {
	account, ip *keyedLimiter
}

func newLoginLimiter(l LoginLimits) *loginLimiter {
	return &loginLimiter{account: newKeyedLimiter(l.AccountPoints, l.Window, l.Keys), ip: newKeyedLimiter(l.IPPoints, l.Window, l.Keys)}
}

// take counts one attempt against both buckets and returns the tighter status: a refusal if
// either refuses (the one to wait longest for), else the one with fewer attempts left.
func (l *loginLimiter) take(accountKey, ip string, now time.Time) limitStatus {
	a := l.account.take(accountKey, now)
	b := l.ip.take(ip, now)
	return tighter(a, b)
}

// tighter is the status a client should be shown of two buckets an attempt counted against.
func tighter(a, b limitStatus) limitStatus {
	switch {
	case !a.allowed && !b.allowed:
		if b.next > a.next {
			return b
		}
		return a
	case !a.allowed:
		return a
	case !b.allowed:
		return b
	case b.remaining < a.remaining:
		return b
	}
	return a
}

// setHeaders writes the reference PDS's rate-limit headers (and Retry-After on a refusal).
func (st limitStatus) setHeaders(h http.Header, now time.Time) {
	h.Set("RateLimit-Limit", strconv.Itoa(st.limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(st.remaining))
	h.Set("RateLimit-Reset", strconv.FormatInt(now.Add(st.next).Unix(), 10))
	h.Set("RateLimit-Policy", strconv.Itoa(st.limit)+";w="+strconv.Itoa(int(st.window/time.Second)))
	if !st.allowed {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(st.next.Seconds()))))
	}
}

// errRateLimited is the reference's refusal of an attempt past a limit.
func errRateLimited() *XRPCError {
	return errNamed(http.StatusTooManyRequests, "RateLimitExceeded", "Rate Limit Exceeded")
}

// clientIP is the address a request came from. Forwarding headers are not trusted: the PDS
// is served directly, and a header a client writes would let it pick its own bucket.
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
