package computecontract

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/market"
)

// finish records the decision once (write), stamping releasedAt on the release; a contract
// that ended forgets its rfp's time and, when it is being deleted, lets go (dropFinalizer).
func (r *Reconciler) finish(ctx context.Context, rd *round) (reconcile.Result, error) {
	st, d := &rd.obj.Status, rd.d
	if d.Phase == v1alpha1.ComputeContractReleased && st.ReleasedAt == nil {
		t := metav1.NewTime(rd.now)
		st.ReleasedAt = &t
	}
	res, err := r.write(ctx, rd.orig, rd.obj, d)
	if err != nil {
		return res, err
	}
	if d.Phase == v1alpha1.ComputeContractReleased || d.Phase == v1alpha1.ComputeContractFailed {
		r.forgetRFP(st.RFP)
	}
	if rd.deleting && (d.Phase == v1alpha1.ComputeContractReleased || d.Phase == v1alpha1.ComputeContractFailed) {
		return r.dropFinalizer(ctx, rd.obj)
	}
	return res, nil
}

// write records the decided phase, reason and message once, and returns the requeue.
func (r *Reconciler) write(ctx context.Context, orig, obj *v1alpha1.ComputeContract, d market.Decision) (reconcile.Result, error) {
	st := &obj.Status
	st.ObservedGeneration = obj.Generation
	st.Phase = d.Phase
	if d.Message != "" {
		st.Message = d.Message
	}
	cond := metav1.Condition{Type: "Ready", ObservedGeneration: obj.Generation, Reason: string(d.Phase), Message: st.Message}
	if d.Reason != "" {
		cond.Reason = d.Reason
	}
	cond.Status = metav1.ConditionFalse
	if d.Phase == v1alpha1.ComputeContractHeld {
		cond.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	res, err := reconcilekit.CommitStatus(ctx, r.Client, orig, obj)
	if err != nil || res.RequeueAfter > 0 {
		return res, client.IgnoreNotFound(err)
	}
	if orig.Status.Phase != st.Phase {
		r.Log.Info("computecontract_phase", "contract", obj.Namespace+"/"+obj.Name, "phase", st.Phase, "message", st.Message)
	}
	return reconcile.Result{RequeueAfter: d.RequeueAfter}, nil
}
