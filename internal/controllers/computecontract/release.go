package computecontract

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/market"
)

// release applies a release asked for (spec.release or the deletion): the delete event is
// written on the receipt once, and the winner's answer (its own vm.delete) is waited for by
// Next. A contract released before any accept, or whose winner never wrote a receipt,
// writes nothing.
func (r *Reconciler) release(ctx context.Context, rd *round) (reconcile.Result, error) {
	if rd.d.Action != market.ActDelete {
		return reconcile.Result{}, nil
	}
	return r.writeDelete(ctx, rd)
}

// writeDelete writes our compute.events.vm.delete on the receipt, its reason
// spec.release.reason, else the decision's reason, else "released".
func (r *Reconciler) writeDelete(ctx context.Context, rd *round) (reconcile.Result, error) {
	obj := rd.obj
	reason := "released"
	if obj.Spec.Release != nil && obj.Spec.Release.Reason != "" {
		reason = obj.Spec.Release.Reason
	} else if rd.d.Reason != "" {
		reason = rd.d.Reason
	}
	ev := mk.Event{Receipt: atrepo.StrongRef{URI: rd.s.Receipt.URI, CID: rd.s.Receipt.CID},
		Payload: mk.EventPayload{ComputeEventsVMDelete: &mk.ComputeEventsVMDelete{Reason: &reason}}}
	res, err := put(ctx, rd.repo, obj, keyDelete, mk.EventNSID, ev)
	if err != nil {
		return reconcile.Result{}, err
	}
	crashpoint.Hit(crashpoint.RequesterAfterDelete)
	r.addEvent(&obj.Status, evDelete, res.URI, rd.now)
	return reconcile.Result{}, nil
}
