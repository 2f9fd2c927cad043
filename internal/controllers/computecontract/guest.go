package computecontract

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/repos"
)

// guest tends a guest whose receipt binds our accept: the secrets go to the winner point to
// point until it has them, and a guest that missed its ready timeout (or never got its
// secrets) has its delete written. vm.started, vm.onNetwork and the guest's end are read
// (observe), not written.
func (r *Reconciler) guest(ctx context.Context, rd *round) (reconcile.Result, error) {
	switch rd.d.Action {
	case market.ActDeliverSecrets:
		return r.secretsToWinner(ctx, rd)
	case market.ActDelete:
		return r.writeDelete(ctx, rd)
	}
	return reconcile.Result{}, nil
}

// secretsToWinner hands the secrets over (deliver); once the winner has them, Next decides
// again (the guest may be Held already). A Secret not readable or a delivery refused is a
// condition, retried (d.RequeueAfter, at most a second) until the ready deadline.
func (r *Reconciler) secretsToWinner(ctx context.Context, rd *round) (reconcile.Result, error) {
	err := r.deliver(ctx, rd.repo, rd.obj)
	if err == nil {
		rd.s.SecretsDelivered = true
		rd.d = market.Next(rd.s)
		return reconcile.Result{}, nil
	}
	var se *SecretError
	var de *DeliveryError
	switch {
	case errors.As(err, &se):
		r.secretsCondition(rd.obj, metav1.ConditionFalse, ReasonSecretUnavailable, se.Error())
	case errors.As(err, &de):
		r.secretsCondition(rd.obj, metav1.ConditionFalse, ReasonDeliveryFailed, de.Error())
	default:
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, nil
}

// deliver sends the contract's secrets to the winner and records the condition.
func (r *Reconciler) deliver(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract) error {
	vals, err := r.readSecrets(ctx, obj)
	if err != nil {
		return err
	}
	winner := obj.Status.Winner
	if err := deliverSecrets(ctx, repo, r.Index.Endpoint(winner), winner, obj.Status.Accept, vals); err != nil {
		return err
	}
	r.secretsCondition(obj, metav1.ConditionTrue, ReasonDelivered, fmt.Sprintf("%d secret(s) delivered to %s", len(vals), winner))
	r.Log.Info("computecontract_secrets_delivered", "contract", obj.Namespace+"/"+obj.Name, "winner", winner, "count", len(vals))
	return nil
}

func (r *Reconciler) secretsCondition(obj *v1alpha1.ComputeContract, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionSecretsDelivered),
		Status: status, Reason: reason, Message: msg, ObservedGeneration: obj.Generation})
}
