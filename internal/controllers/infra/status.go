package infra

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
)

// writeStatus is the one status write of a reconcile: the steps changed p.obj's status in
// memory; it is compared with what was read and patched once, locked on the version the
// object is at now (a pull may have moved it on) by reconcilekit.CommitStatus. A conflict
// comes back as a short requeue.
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) (reconcile.Result, error) {
	o := p.obj
	o.status.ObservedGeneration = o.obj.GetGeneration()
	meta.SetStatusCondition(&o.status.Conditions, readyCondition(o.status.Phase, o.obj.GetGeneration(), p.stalled))
	res, err := reconcilekit.CommitStatus(ctx, r.Client, p.stored.obj, o.obj)
	if err != nil && !apierrors.IsNotFound(err) {
		return res, fmt.Errorf("writing status of %s/%s: %w", o.obj.GetNamespace(), o.obj.GetName(), err)
	}
	return res, nil
}

// readyCondition is True when what is observed is what is declared: a staged deployment, or
// every requested contract deployed. While it is not, a stalled contract gives its reason and
// message (the first in spec order its reason; every one in the message), so the deployment
// says why it does not progress.
const maxReadyMessage = 4096

func readyCondition(phase v1alpha1.InfraPhase, generation int64, stalled []infra.StalledContract) metav1.Condition {
	c := metav1.Condition{Type: string(v1alpha1.ConditionReady), ObservedGeneration: generation, Reason: string(phase)}
	switch phase {
	case v1alpha1.InfraStaged:
		c.Status, c.Message = metav1.ConditionTrue, "every contract is staged; nothing is requested"
	case v1alpha1.InfraDeployed:
		c.Status, c.Message = metav1.ConditionTrue, "every requested contract is deployed"
	default:
		c.Status, c.Message = metav1.ConditionFalse, "waiting for contracts: "+string(phase)
	}
	if c.Status == metav1.ConditionFalse && len(stalled) > 0 {
		c.Reason = stalled[0].Reason
		for _, s := range stalled {
			c.Message += fmt.Sprintf("; contract %s: %s: %s", s.Contract, s.Reason, s.Message)
		}
		// A condition's message holds 32768 bytes; 64 long messages would not fit.
		if len(c.Message) > maxReadyMessage {
			c.Message = strings.ToValidUTF8(c.Message[:maxReadyMessage], "") + " ..."
		}
	}
	if c.Reason == "" {
		c.Reason = string(v1alpha1.InfraPending)
	}
	return c
}
