package gateway

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit bounds the calls the gateway takes: per client IP address before the caller is
// known (every request, a refused one too), and per account once its token is verified. A
// zero Rate takes the default; rate.Inf turns that limit off.
type RateLimit struct {
	PerIP       rate.Limit
	PerIPBurst  int
	PerDID      rate.Limit
	PerDIDBurst int
}

// Default rates: an account's client polling a cluster's phase or following a Job stays well
// under them; a loop that calls as fast as it can does not. Every caller behind one address
// (a PDS that proxies for its users, a NAT) shares the per-IP limit, so it is the larger.
const (
	DefaultPerIP       = rate.Limit(50)
	DefaultPerIPBurst  = 100
	DefaultPerDID      = rate.Limit(20)
	DefaultPerDIDBurst = 40
)

func (l RateLimit) withDefaults() RateLimit {
	if l.PerIP == 0 {
		l.PerIP = DefaultPerIP
	}
	if l.PerIPBurst <= 0 {
		l.PerIPBurst = DefaultPerIPBurst
	}
	if l.PerDID == 0 {
		l.PerDID = DefaultPerDID
	}
	if l.PerDIDBurst <= 0 {
		l.PerDIDBurst = DefaultPerDIDBurst
	}
	return l
}

// limiters is one token bucket per key; a bucket idle for limiterIdle is forgotten (it is
// full again by then), so the map holds the keys seen recently.
type limiters struct {
	limit rate.Limit
	burst int

	mu        sync.Mutex
	by        map[string]*limiterEntry
	lastSweep time.Time
}

type limiterEntry struct {
	lim  *rate.Limiter
	seen time.Time
}

const limiterIdle = 10 * time.Minute

func newLimiters(limit rate.Limit, burst int) *limiters {
	return &limiters{limit: limit, burst: burst, by: map[string]*limiterEntry{}}
}

// allow takes one call of key; when the bucket is empty it answers how long until the next
// call is allowed.
func (l *limiters) allow(key string, now time.Time) (bool, time.Duration) {
	if l.limit == rate.Inf {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.lastSweep) > time.Minute {
		for k, e := range l.by {
			if now.Sub(e.seen) > limiterIdle {
				delete(l.by, k)
			}
		}
		l.lastSweep = now
	}
	e := l.by[key]
	if e == nil {
		e = &limiterEntry{lim: rate.NewLimiter(l.limit, l.burst)}
		l.by[key] = e
	}
	e.seen = now
	if e.lim.AllowN(now, 1) {
		return true, 0
	}
	r := e.lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, wait
}

// rateLimited is the refusal of a call past a limit, with the Retry-After the caller should
// honour.
func rateLimited(who string, wait time.Duration) *Error {
	e := xrpcErr(http.StatusTooManyRequests, ErrRateLimitExceeded, "too many calls from %s; retry after %s", who, wait.Round(time.Millisecond))
	e.RetryAfter = wait
	return e
}

// clientIP is the address the request came from (the connection's, never a header a client
// can set).
func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
