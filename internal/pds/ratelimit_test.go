package pds

import (
	"testing"
	"time"
)

// The reference's fixed window: points attempts from the first one until the window ends,
// however they are spaced, then a fresh window.
func TestKeyedLimiterFixedWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	k := newKeyedLimiter(3, 10*time.Second, 2)
	steps := []struct {
		at        time.Duration
		key       string
		allowed   bool
		remaining int
		next      time.Duration
	}{
		{0, "a", true, 2, 10 * time.Second},
		{4 * time.Second, "a", true, 1, 6 * time.Second},
		{9 * time.Second, "a", true, 0, time.Second},
		{9*time.Second + 500*time.Millisecond, "a", false, 0, 500 * time.Millisecond},
		{9 * time.Second, "b", true, 2, 10 * time.Second},  // another key, its own window
		{10 * time.Second, "a", true, 2, 10 * time.Second}, // a's window ended: a new one
		{11 * time.Second, "c", true, 2, 10 * time.Second}, // a third key: b, least recent, is forgotten
		{12 * time.Second, "b", true, 2, 10 * time.Second},
	}
	for i, s := range steps {
		st := k.take(s.key, t0.Add(s.at))
		if st.allowed != s.allowed || st.remaining != s.remaining || st.next != s.next || st.limit != 3 {
			t.Errorf("step %d (%s at %s): %+v, want allowed %v remaining %d next %s", i, s.key, s.at, st, s.allowed, s.remaining, s.next)
		}
	}
}

func TestTighterStatus(t *testing.T) {
	acct := func(allowed bool, rem int, next time.Duration) limitStatus {
		return limitStatus{limit: 30, remaining: rem, next: next, allowed: allowed}
	}
	ip := func(allowed bool, rem int, next time.Duration) limitStatus {
		return limitStatus{limit: 100, remaining: rem, next: next, allowed: allowed}
	}
	cases := []struct {
		name      string
		a, b      limitStatus
		wantLimit int
	}{
		{"both allow, account tighter", acct(true, 5, time.Minute), ip(true, 50, time.Minute), 30},
		{"both allow, address tighter", acct(true, 20, time.Minute), ip(true, 3, time.Minute), 100},
		{"account refuses", acct(false, 0, time.Minute), ip(true, 1, time.Minute), 30},
		{"address refuses", acct(true, 29, time.Minute), ip(false, 0, time.Minute), 100},
		{"both refuse: the longer wait", acct(false, 0, time.Minute), ip(false, 0, 2*time.Minute), 100},
	}
	for _, c := range cases {
		if got := tighter(c.a, c.b); got.limit != c.wantLimit {
			t.Errorf("%s: %+v", c.name, got)
		}
	}
}
