package nodehost

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/tenant"
)

func TestEndedDelay(t *testing.T) {
	for _, c := range []struct {
		base   time.Duration
		streak int
		want   time.Duration
	}{
		{30 * time.Second, 0, 30 * time.Second},
		{30 * time.Second, 1, time.Minute},
		{30 * time.Second, 3, 4 * time.Minute},
		{30 * time.Second, 5, MaxEndedRetry},
		{30 * time.Second, 1000, MaxEndedRetry},
		{time.Hour, 2, time.Hour}, // a base past the bound is kept, not shortened
		{time.Second, -1, time.Second},
	} {
		if got := EndedDelay(c.base, c.streak); got != c.want {
			t.Errorf("EndedDelay(%s, %d) = %s, want %s", c.base, c.streak, got, c.want)
		}
	}
}

// The streak grows by a round of deletions and ends when a claim is seen running for the
// first time; a node that already ran does not end it.
func TestEndedClaimsStreak(t *testing.T) {
	k := tenant.Key{Namespace: "default", Name: "web"}
	claim := func(uid string, phase v1alpha1.NodeClaimPhase) *v1alpha1.NodeClaim {
		return &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}, Status: v1alpha1.NodeClaimStatus{Phase: phase}}
	}
	var e endedClaims
	now := time.Unix(1000, 0)
	old := claim("old", v1alpha1.NodeClaimRunning)
	streak := func(claims ...*v1alpha1.NodeClaim) int {
		_, s := e.of(k, claims, now)
		return s
	}
	if s := streak(old, claim("a", v1alpha1.NodeClaimFailed)); s != 0 {
		t.Fatalf("streak %d at first", s)
	}
	e.lengthen(k)
	e.lengthen(k)
	if s := streak(old, claim("b", v1alpha1.NodeClaimFailed)); s != 2 {
		t.Fatalf("streak %d after two rounds with only the old node running, want 2", s)
	}
	if s := streak(old, claim("c", v1alpha1.NodeClaimRunning)); s != 0 {
		t.Fatalf("streak %d after a new claim ran, want 0", s)
	}
	e.lengthen(k)
	e.forget(k)
	if s := streak(); s != 0 {
		t.Fatalf("streak %d after forget", s)
	}
}
