package infra

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// writeStatus is the one status write of a reconcile: the steps changed p.obj's status in
// memory; it is compared with what was read and patched once, with an optimistic lock.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	o := p.obj
	o.status.ObservedGeneration = o.obj.GetGeneration()
	meta.SetStatusCondition(&o.status.Conditions, readyCondition(o.status.Phase, o.obj.GetGeneration()))
	if equality.Semantic.DeepEqual(p.stored.statusOf(), o.statusOf()) {
		return nil
	}
	base := p.stored.obj.DeepCopyObject().(client.Object)
	// A pull moved the object on; the lock is on the version the pull left.
	base.SetResourceVersion(o.obj.GetResourceVersion())
	if err := r.Client.Status().Patch(ctx, o.obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing status of %s/%s: %w", o.obj.GetNamespace(), o.obj.GetName(), err)
	}
	return nil
}

// done turns a step's error into the reconcile's result: a conflict is an ordinary retry
// (someone wrote in between, read again), anything else is logged by the manager.
func done(err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		return reconcile.Result{Requeue: true}, nil
	}
	return reconcile.Result{}, err
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
