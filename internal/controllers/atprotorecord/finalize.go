package atprotorecord

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/repos"
)

// finalize deletes the record under deletionPolicy Delete, or leaves it under Retain and for
// the collections that are never deleted, then lets the object go.
func (r *Reconciler) finalize(ctx context.Context, obj *v1alpha1.AtprotoRecord) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, v1alpha1.FinalizerAtprotoRecord) {
		return reconcile.Result{}, nil
	}
	name := obj.Namespace + "/" + obj.Name
	coll, rkey := obj.Spec.Collection, obj.Spec.RKey
	switch {
	case obj.Spec.DeletionPolicy == v1alpha1.DeletionPolicyRetain || NeverDeleted(coll):
		why := "deletionPolicy Retain"
		if NeverDeleted(coll) {
			why = coll + " records are never deleted by their object"
		}
		r.Log.Info("atprotorecord_retained", "record", name, "uri", obj.Status.URI, "why", why)
	default:
		repo, err := r.Resolver.ForRef(ctx, obj.Namespace, obj.Spec.RepoRef)
		if err != nil {
			var ar v1alpha1.AtprotoRepo
			if gerr := r.Client.Get(ctx, refKey(obj.Namespace, obj.Spec.RepoRef), &ar); apierrors.IsNotFound(gerr) {
				// The repo object is gone: nothing can delete through it any more.
				r.Log.Warn("atprotorecord_orphaned", "record", name, "uri", obj.Status.URI, "err", err)
				break
			}
			retry := repos.RetryAfter(err)
			if retry == 0 {
				retry = unavailableRetry
			}
			return reconcile.Result{RequeueAfter: retry}, nil
		}
		if err := repo.Delete(ctx, coll, rkey, nil); err != nil && !errors.Is(err, repos.ErrNotFound) {
			return reconcile.Result{}, fmt.Errorf("deleting %s of %s: %w", obj.Status.URI, name, err)
		}
		r.Log.Info("atprotorecord_deleted", "record", name, "uri", obj.Status.URI)
	}
	_, err := reconcilekit.RemoveFinalizer(ctx, r.Client, obj, v1alpha1.FinalizerAtprotoRecord)
	return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
}
