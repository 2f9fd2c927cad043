package nodehost

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/quota"
)

func TestUsageOf(t *testing.T) {
	claim := func(uid string, created time.Time, mod func(*v1alpha1.NodeClaim)) *v1alpha1.NodeClaim {
		c := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), CreationTimestamp: metav1.NewTime(created)}}
		if mod != nil {
			mod(c)
		}
		return c
	}
	now := t0
	h := time.Hour
	deleting := func(c *v1alpha1.NodeClaim) { c.DeletionTimestamp = &metav1.Time{Time: now.Add(-h)} }
	failed := func(c *v1alpha1.NodeClaim) { c.Status.Phase = v1alpha1.NodeClaimFailed }
	for _, c := range []struct {
		name     string
		claims   []*v1alpha1.NodeClaim
		gone     map[string]quota.Interval
		nodes    int
		nodeTime time.Duration
	}{
		{"nothing", nil, nil, 0, 0},
		{"two running claims", []*v1alpha1.NodeClaim{claim("a", now.Add(-2*h), nil), claim("b", now.Add(-h), nil)}, nil, 2, 3 * h},
		{"a claim being released is still a node, counted up to now", []*v1alpha1.NodeClaim{claim("a", now.Add(-3*h), deleting)}, nil, 1, 3 * h},
		{"a failed claim is no node but its time counts", []*v1alpha1.NodeClaim{claim("a", now.Add(-h), failed)}, nil, 0, h},
		{"the ledger's gone claims count their interval", nil,
			map[string]quota.Interval{"x": {From: now.Add(-10 * h), To: now.Add(-6 * h)}}, 0, 4 * h},
		{"a claim the ledger has already counts once", []*v1alpha1.NodeClaim{claim("a", now.Add(-5*h), deleting)},
			map[string]quota.Interval{"a": {From: now.Add(-5 * h), To: now.Add(-2 * h)}}, 1, 3 * h},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, ivs := UsageOf(c.claims, c.gone)
			if got := quota.NodeTime(ivs, now); u.Nodes != c.nodes || got != c.nodeTime {
				t.Errorf("UsageOf: %d node(s), node time %s; want %d, %s", u.Nodes, got, c.nodes, c.nodeTime)
			}
		})
	}
}
