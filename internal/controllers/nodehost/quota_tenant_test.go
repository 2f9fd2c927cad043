package nodehost_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/nodehost"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/quota/ledger"
)

// The nodes quota cuts a scale-up: three pods needing a node each, maxNodes 4, but the owner
// may hold 2 nodes: two claims, and the Cluster's Scaling condition says QuotaExceeded,
// naming the quota and the use.
func TestNodeHost_NodesQuotaCutsScaleUp(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}},
		nodehost.Options{Quota: quota.Limits{Nodes: 2}})
	for _, p := range []string{"a", "b", "c"} {
		r.pod(p)
	}
	for _, p := range []string{"a", "b", "c"} {
		r.unschedulable(p)
	}
	r.waitClaims(2, 30*time.Second)
	r.waitScaling(nodehost.ReasonQuotaExceeded)
	r.stayClaims(2, 3*time.Second)
	if c := r.scaling(); !strings.Contains(c.Message, "quota nodes exceeded") || !strings.Contains(c.Message, "uses 2 of 2 nodes") {
		t.Errorf("Scaling message %q does not name the quota and the use", c.Message)
	}
}

// Node-hours count the nodes that are gone: a ledger entry of 10 h ended an hour ago, a
// limit of 5 node-hours: a pending pod gets no claim, and Scaling says QuotaExceeded
// node-hours.
func TestNodeHost_NodeHoursQuotaRefusesScaleUp(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 2, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}},
		nodehost.Options{Quota: quota.Limits{Nodes: 2, NodeHours: 5}})
	now := time.Now()
	if err := ledger.Record(context.Background(), r.c, r.c, ns, owner, "gone-claim-uid",
		quota.Interval{From: now.Add(-11 * time.Hour), To: now.Add(-time.Hour)}, now); err != nil {
		t.Fatal(err)
	}
	r.pod("a")
	r.unschedulable("a")
	r.waitScaling(nodehost.ReasonQuotaExceeded)
	r.stayClaims(0, 3*time.Second)
	if c := r.scaling(); !strings.Contains(c.Message, "quota node-hours exceeded") || !strings.Contains(c.Message, "uses 10 of 5 node-hours") {
		t.Errorf("Scaling message %q does not name the quota and the use", c.Message)
	}
}
