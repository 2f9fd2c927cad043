package nodehost

import (
	"context"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// writeStatus writes the fields of the Cluster status the node host owns (the Scaling
// condition, nodes) once: compare, then patch with an optimistic lock. The Cluster
// controller writes the same status (phase, the Ready condition); on a conflict the Cluster
// is read again from the API server and only the node host's fields are set on it.
// status.nodes counts the claims whose node is Ready in the tenant; it is left as it was
// while the tenant was not read, and 0 once every claim goes.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	own := func(c *v1alpha1.Cluster) {
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
	}
	stored, c := p.stored, p.cluster
	own(c)
	for try := 0; ; try++ {
		if equality.Semantic.DeepEqual(stored.Status, c.Status) {
			return nil
		}
		err := r.Client.Status().Patch(ctx, c, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) || try == 4 {
			return client.IgnoreNotFound(err)
		}
		fresh := &v1alpha1.Cluster{}
		if err := r.reader().Get(ctx, client.ObjectKeyFromObject(c), fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		stored, c = fresh, fresh.DeepCopy()
		own(c)
	}
}
