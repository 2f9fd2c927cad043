package nodehost

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
)

// writeStatus writes the fields of the Cluster status the node host owns (the Scaling
// condition, nodes) once, through reconcilekit.CommitOwnedStatus: the Cluster controller
// writes the same status (phase, the Ready condition), so on a conflict only the node host's
// fields are set on a fresh read. status.nodes counts the claims whose node is Ready in the
// tenant; it is left as it was while the tenant was not read, and 0 once every claim goes.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	own := func(c *v1alpha1.Cluster) error {
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
		return nil
	}
	_, err := reconcilekit.CommitOwnedStatus(ctx, r.Client, r.reader(), p.stored, p.cluster, own)
	return client.IgnoreNotFound(err)
}
