package infra

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
)

// writeStatus is the one status write of a reconcile: the steps changed p.obj's status in
// memory; it is compared with what was read and patched once, locked on the version the
// object is at now (a pull may have moved it on) by reconcilekit.CommitStatus. A conflict
// comes back as a short requeue.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) (reconcile.Result, error) {
	o := p.obj
	o.status.ObservedGeneration = o.obj.GetGeneration()
	meta.SetStatusCondition(&o.status.Conditions, readyCondition(o.status.Phase, o.obj.GetGeneration()))
	res, err := reconcilekit.CommitStatus(ctx, r.Client, p.stored.obj, o.obj)
	if err != nil && !apierrors.IsNotFound(err) {
		return res, fmt.Errorf("writing status of %s/%s: %w", o.obj.GetNamespace(), o.obj.GetName(), err)
	}
	return res, nil
}

// readyCondition is True when what is observed is what is declared: a staged deployment, or
// every requested contract deployed.
func readyCondition(phase v1alpha1.InfraPhase, generation int64) metav1.Condition {
	c := metav1.Condition{Type: string(v1alpha1.ConditionReady), ObservedGeneration: generation, Reason: string(phase)}
	switch phase {
	case v1alpha1.InfraStaged:
		c.Status, c.Message = metav1.ConditionTrue, "every contract is staged; nothing is requested"
	case v1alpha1.InfraDeployed:
		c.Status, c.Message = metav1.ConditionTrue, "every requested contract is deployed"
	default:
		c.Status, c.Message = metav1.ConditionFalse, "waiting for contracts: "+string(phase)
	}
	if c.Reason == "" {
		c.Reason = string(v1alpha1.InfraPending)
	}
	return c
}
