package computecontract

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
)

// dropFinalizer lets a finished contract go; a conflict reads again soon.
func (r *Reconciler) dropFinalizer(ctx context.Context, obj *v1alpha1.ComputeContract) (reconcile.Result, error) {
	_, err := reconcilekit.RemoveFinalizer(ctx, r.Client, obj, v1alpha1.FinalizerComputeContractRelease)
	return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
}
