package nodehost

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// writeStatus writes the Scaling condition and status.nodes once: copy, change, compare,
// patch with an optimistic lock (the Cluster controller writes the same status; a conflict
// retries from a fresh read). status.nodes counts the claims whose node is Ready in the
// tenant; it is left as it was while the tenant was not read, and 0 once every claim goes.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	c := p.cluster
	if p.joined != nil {
		c.Status.Nodes = nodesOf(p.claims, p.joined)
	} else if !c.DeletionTimestamp.IsZero() || !c.Spec.Running {
		c.Status.Nodes = 0
	}
	status := metav1.ConditionFalse
	if p.outcome.acting {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionScaling), Status: status,
		Reason: p.outcome.reason, Message: p.outcome.message, ObservedGeneration: c.Generation})
	if equality.Semantic.DeepEqual(p.stored.Status, c.Status) {
		return nil
	}
	err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(p.stored, client.MergeFromWithOptimisticLock{}))
	return client.IgnoreNotFound(err)
}
