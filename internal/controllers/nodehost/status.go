package nodehost

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
)

// FieldManager is the field manager of the node host's applies of a Cluster's status.
const FieldManager = "socialweb.computer/nodehost"

// StatusOwner is the part of a Cluster's status the node host owns: the Cluster controller
// (internal/controllers/cluster) owns the rest (phase, the Ready condition, ...).
var StatusOwner = reconcilekit.StatusOwner{Manager: FieldManager,
	Fields: []string{"nodes"}, Conditions: []string{string(v1alpha1.ConditionScaling)}}

// writeStatus writes the fields of the Cluster status the node host owns (the Scaling
// condition, nodes) once, by apply (reconcilekit.ApplyStatus), so the Cluster controller's
// writes of the same status neither conflict with it nor are lost. status.nodes counts the
// claims whose node is Ready in the tenant; it is left as it was while the tenant was not
// read, and 0 once every claim goes.
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
	_, err := reconcilekit.ApplyStatus(ctx, r.Client, StatusOwner, p.stored, c)
	return client.IgnoreNotFound(err)
}
