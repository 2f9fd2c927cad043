package cluster

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/tenant"
)

// +kubebuilder:rbac:groups=socialweb.computer,resources=nodeclaims,verbs=list;watch

// sleepAfter is the Cluster's spec.sleepAfter; 0 when unset.
func sleepAfter(c *v1alpha1.Cluster) time.Duration {
	if c.Spec.SleepAfter == nil {
		return 0
	}
	return c.Spec.SleepAfter.Duration
}

// sleepDecision reads what keeps a Ready cluster awake (its nodes, its NodeClaims, the node
// host's Scaling condition, its gate's connections) and asks tenant.DecideSleep.
func (r *Reconciler) sleepDecision(ctx context.Context, key tenant.Key, c *v1alpha1.Cluster, s tenant.Status, nodes int) (tenant.SleepDecision, error) {
	after := sleepAfter(c)
	if after <= 0 {
		return tenant.DecideSleep(tenant.Idleness{}), nil
	}
	var claims v1alpha1.NodeClaimList
	if err := r.Client.List(ctx, &claims, client.InNamespace(c.Namespace)); err != nil {
		return tenant.SleepDecision{}, err
	}
	in := tenant.Idleness{SleepAfter: after, Now: time.Now(), ReadyAt: s.ReadyAt, Nodes: nodes, Demand: demand(c)}
	for _, cl := range claims.Items {
		if ns := cl.Spec.ClusterRef.Namespace; cl.Spec.ClusterRef.Name == c.Name && (ns == "" || ns == c.Namespace) {
			in.Claims++
		}
	}
	in.OpenConns, in.LastActive = r.Tenants.Activity(key)
	r.mu.Lock()
	if r.lastBusy == nil {
		r.lastBusy = map[tenant.Key]time.Time{}
	}
	if in.Nodes > 0 || in.Claims > 0 || in.Demand {
		r.lastBusy[key] = in.Now
	}
	in.LastBusy = r.lastBusy[key]
	r.mu.Unlock()
	return tenant.DecideSleep(in), nil
}

// demand: the node host (internal/controllers/nodehost) is adding nodes, or holds pending
// pods for one (batching them, or waiting for claims in flight).
func demand(c *v1alpha1.Cluster) bool {
	cond := meta.FindStatusCondition(c.Status.Conditions, string(v1alpha1.ConditionScaling))
	if cond == nil {
		return false
	}
	return cond.Status == metav1.ConditionTrue || slices.Contains(DemandReasons, cond.Reason)
}

// DemandReasons are the Scaling condition's reasons while pending pods wait for a node
// that is not there yet (the node host's names of scale's reasons).
var DemandReasons = []string{"BatchingPendingPods", "ClaimsInFlight", "IntentAndNoNode", "IntentBeyondCapacity"}

func setAsleep(c *v1alpha1.Cluster, why string) {
	c.Status.Phase = v1alpha1.ClusterSleeping
	setReady(c, metav1.ConditionFalse, ReasonAsleep, "asleep: "+why+"; the control plane is stopped and its store kept, and the first request through status.server or the gateway wakes it")
}
