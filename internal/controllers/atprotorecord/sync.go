package atprotorecord

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/repos"
)

// sync reads the record, decides, and writes when the decision says so. It only changes
// obj.Status; the caller writes it.
func (r *Reconciler) sync(ctx context.Context, obj *v1alpha1.AtprotoRecord) (reconcile.Result, error) {
	desired, err := prepare(obj.Spec.Collection, obj.Spec.Record.Raw)
	if err != nil {
		// Nothing to retry: a new generation of the spec triggers the next attempt.
		setInSync(obj, false, v1alpha1.ReasonInvalidRecord, err.Error())
		return reconcile.Result{}, nil
	}
	repo, err := r.Resolver.ForRef(ctx, obj.Namespace, obj.Spec.RepoRef)
	if err != nil {
		return unavailable(obj, err), nil
	}
	coll, rkey := obj.Spec.Collection, obj.Spec.RKey
	var cur current
	switch rec, err := repo.Get(ctx, coll, rkey); {
	case errors.Is(err, repos.ErrNotFound):
	case err != nil:
		return unavailable(obj, err), nil
	default:
		cur = current{Exists: true, CID: rec.CID, Value: rec.Value}
	}
	obj.Status.URI = fmt.Sprintf("at://%s/%s/%s", repo.DID(), coll, rkey)
	d := decide(desired, guard{SwapCID: obj.Spec.SwapCID, CreateOnly: obj.Spec.CreateOnly, Seen: obj.Status.CID != ""}, cur)
	switch d.Step {
	case stepNone:
		obj.Status.CID = cur.CID
		if c := metaInSync(obj); c != nil && c.Status == metav1.ConditionTrue && c.Reason == string(v1alpha1.ReasonWritten) && c.ObservedGeneration == obj.Generation {
			// Keep saying Written for the write this generation made.
			return resync(), nil
		}
		setInSync(obj, true, v1alpha1.ReasonInSync, "the repo holds the record")
		return resync(), nil
	case stepBlock:
		if cur.Exists {
			obj.Status.CID = cur.CID
		}
		setInSync(obj, false, v1alpha1.ReasonSwapMismatch, d.Message)
		return reconcile.Result{}, nil
	}
	crashpoint.Hit(crashpoint.RecordAfterRead)
	res, err := repo.Put(ctx, coll, rkey, desired, d.Swap)
	if err == nil {
		crashpoint.Hit(crashpoint.RecordAfterWrite)
	}
	switch {
	case errors.Is(err, repos.ErrSwapMismatch) && obj.Spec.SwapCID != "":
		setInSync(obj, false, v1alpha1.ReasonSwapMismatch, fmt.Sprintf("spec.swapCid is %s but the repo holds another version; not written (%v)", obj.Spec.SwapCID, err))
		return reconcile.Result{}, nil
	case errors.Is(err, repos.ErrSwapMismatch) && obj.Spec.CreateOnly:
		// Created by someone else between our read and our write: never overwritten.
		setInSync(obj, false, v1alpha1.ReasonSwapMismatch, fmt.Sprintf("spec.createOnly is set but a record was created meanwhile; not written (%v)", err))
		return reconcile.Result{}, nil
	case errors.Is(err, repos.ErrSwapMismatch):
		// Someone wrote between our read and our write: read again.
		return reconcilekit.RequeueSoon(), nil
	case errors.Is(err, repos.ErrInvalidRecord):
		setInSync(obj, false, v1alpha1.ReasonInvalidRecord, err.Error())
		return reconcile.Result{}, nil
	case isUnavailable(err):
		return unavailable(obj, err), nil
	case err != nil:
		// An answer this controller does not know: report it and retry with backoff.
		setInSync(obj, false, v1alpha1.ReasonRepoUnavailable, err.Error())
		return reconcile.Result{}, err
	}
	now := metav1.NewTime(r.Now())
	obj.Status.URI, obj.Status.CID, obj.Status.LastWriteAt = res.URI, res.CID, &now
	setInSync(obj, true, v1alpha1.ReasonWritten, "wrote "+res.CID)
	r.Log.Info("atprotorecord_written", "record", obj.Namespace+"/"+obj.Name, "uri", res.URI, "cid", res.CID)
	return resync(), nil
}

func resync() reconcile.Result { return reconcile.Result{RequeueAfter: ResyncPeriod} }

func metaInSync(obj *v1alpha1.AtprotoRecord) *metav1.Condition {
	for i := range obj.Status.Conditions {
		if obj.Status.Conditions[i].Type == string(v1alpha1.ConditionInSync) {
			return &obj.Status.Conditions[i]
		}
	}
	return nil
}
