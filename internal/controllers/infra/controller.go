package infra

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
)

// ControllerName names the Infra controller in logs and metrics.
const ControllerName = "infra"

// Reconciler reconciles Infra objects.
type Reconciler struct {
	Client client.Client
}

// Setup registers the Infra controller with m.
func Setup(m ctrl.Manager, obs manager.ReconcileObserver) error {
	r := &Reconciler{Client: m.GetClient()}
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.Infra{}).
		WithOptions(manager.ControllerOptions(4)).
		Complete(manager.Observed(ControllerName, r, obs))
}

// Reconcile reports the observed status of one Infra.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.Infra
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	stored := obj.DeepCopy()
	obj.Status.ObservedGeneration = obj.Generation
	obj.Status.Phase, obj.Status.ContractsReady = summarize(obj.Spec.Contracts)
	meta.SetStatusCondition(&obj.Status.Conditions, readyCondition(obj.Status.Phase, obj.Generation))
	if equality.Semantic.DeepEqual(stored.Status, obj.Status) {
		return reconcile.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, &obj, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{Requeue: true}, nil
		}
		return reconcile.Result{}, fmt.Errorf("writing status of %s: %w", req, err)
	}
	return reconcile.Result{}, nil
}

// summarize is the phase while contracts are only declared: every contract staged (or
// none) is Staged; a contract in any other state waits for the market.
func summarize(contracts []v1alpha1.InfraContract) (v1alpha1.InfraPhase, string) {
	phase := v1alpha1.InfraStaged
	for _, c := range contracts {
		if c.State != "" && c.State != v1alpha1.ContractStaged {
			phase = v1alpha1.InfraPending
		}
	}
	return phase, fmt.Sprintf("0/%d", len(contracts))
}

// readyCondition is True when what is observed is what is declared: every contract staged
// is as ready as a staged deployment gets; anything else waits for its contracts.
func readyCondition(phase v1alpha1.InfraPhase, generation int64) metav1.Condition {
	c := metav1.Condition{Type: string(v1alpha1.ConditionReady), ObservedGeneration: generation, Reason: string(phase)}
	switch phase {
	case v1alpha1.InfraStaged:
		c.Status, c.Message = metav1.ConditionTrue, "every contract is staged; nothing is requested"
	default:
		c.Status, c.Message = metav1.ConditionFalse, "waiting for requested contracts"
	}
	return c
}
