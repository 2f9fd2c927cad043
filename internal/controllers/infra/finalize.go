package infra

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
)

// finalize runs the release finalizer of a deleted deployment, in order:
//
//  1. release every unfinished ComputeContract, delete every finished one, and wait while any
//     is left (the ComputeContract watch wakes the object; nothing polls);
//  2. the record's final write (phase ended, endedAt, endReason deleted) through the child,
//     with swapCid the cid just read, and wait for the child to report it; a cluster's node
//     Infra bound with sync Publish deletes its record instead;
//  3. the index at self: the entry leaves live for recentEnded;
//  4. the watch released, the child forced to Retain and deleted (the record stays) and
//     waited for;
//  5. the finalizer removed.
func (r *Reconciler) finalize(ctx context.Context, p *pass) (reconcile.Result, error) {
	o := p.obj
	if !controllerutil.ContainsFinalizer(o.obj, v1alpha1.FinalizerInfraRelease) {
		return reconcile.Result{}, nil
	}
	o.status.Phase = v1alpha1.InfraDeleting
	existing, err := r.ownedContracts(ctx, o)
	if err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	f := infra.FinalizePlan(existing)
	at := metav1.NewTime(p.now.UTC().Truncate(1e9))
	for _, name := range f.Release {
		if err := r.releaseContract(ctx, o.obj.GetNamespace(), name, &v1alpha1.ContractRelease{RequestedAt: at, Reason: infra.ReleaseDeleted}); err != nil {
			return reconcilekit.Settle(ctx, err)
		}
	}
	for _, name := range f.Delete {
		act := infra.ContractAction{ComputeContract: name, Op: infra.OpDelete}
		if err := r.applyContract(ctx, o, act); err != nil {
			return reconcilekit.Settle(ctx, err)
		}
	}
	o.status.Contracts = finalizingStatus(o.status.Contracts, existing)
	if !f.Done {
		return reconcile.Result{}, nil
	}

	recordDone, err := r.finalRecord(ctx, p)
	if err != nil || !recordDone {
		return reconcile.Result{}, err
	}
	child, err := r.getChild(ctx, o)
	if err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	repoRef := (*v1alpha1.ObjectRef)(nil)
	if o.spec.Record != nil {
		repoRef = &o.spec.Record.RepoRef
	} else if child != nil {
		repoRef = &child.Spec.RepoRef
	}
	if repoRef != nil {
		if err := r.releaseWatch(ctx, o, *repoRef); err != nil {
			return reconcilekit.Settle(ctx, err)
		}
	}
	if child != nil {
		// The child has its own finalizer: wait until it is gone (its deletion wakes this
		// object through the owner watch), so a released deployment leaves nothing behind.
		if child.DeletionTimestamp.IsZero() {
			if err := r.deleteChild(ctx, child); err != nil {
				return reconcilekit.Settle(ctx, err)
			}
		}
		return reconcile.Result{}, nil
	}
	if _, err := reconcilekit.RemoveFinalizer(ctx, r.Client, o.obj, v1alpha1.FinalizerInfraRelease); err != nil {
		return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
	}
	r.log().Info("infra_released", "object", o.obj.GetNamespace()+"/"+o.obj.GetName())
	return reconcile.Result{}, nil
}

// finalizingStatus reports the phases of the ComputeContracts still left while the
// finalizer waits; a contract whose ComputeContract is gone is Released.
func finalizingStatus(prev []v1alpha1.InfraContractStatus, existing []infra.ExistingContract) []v1alpha1.InfraContractStatus {
	byName := map[string]*infra.ExistingContract{}
	for i := range existing {
		byName[existing[i].Name] = &existing[i]
	}
	out := make([]v1alpha1.InfraContractStatus, 0, len(prev))
	for _, c := range prev {
		c = *c.DeepCopy()
		if c.ComputeContract != "" {
			if cc := byName[c.ComputeContract]; cc != nil {
				c.Phase = infra.ObservePhase(v1alpha1.ContractReleased, &cc.Status, true)
			} else {
				c.Phase = v1alpha1.InfraContractReleased
			}
		}
		out = append(out, c)
	}
	return out
}

// finalRecord does the record's final write and the index end. It reports done once the
// record is ended (or gone, invalid, or unreachable for good because its AtprotoRepo is
// gone); until then the child's write wakes the object.
func (r *Reconciler) finalRecord(ctx context.Context, p *pass) (bool, error) {
	o := p.obj
	st := o.status.Record
	if o.spec.Record == nil || st == nil || st.URI == "" || st.Direction == v1alpha1.RecordRetained {
		return true, nil
	}
	u, err := infra.ParseATURI(st.URI)
	if err != nil {
		return true, nil
	}
	repo, err := r.Resolver.ForRef(ctx, o.obj.GetNamespace(), o.spec.Record.RepoRef)
	if err != nil {
		var ar v1alpha1.AtprotoRepo
		if gerr := r.Client.Get(ctx, refKey(o.obj.GetNamespace(), o.spec.Record.RepoRef), &ar); apierrors.IsNotFound(gerr) {
			r.log().Warn("infra_record_orphaned", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", st.URI, "err", err)
			return true, nil
		}
		// The repo is there but cannot be reached: the AtprotoRepo watch wakes the object.
		setCondition(o, v1alpha1.ConditionSynced, false, infra.ReasonSyncUnavailable, err.Error(), p.now)
		return false, nil
	}
	b := &binding{repo: repo, repoRef: o.spec.Record.RepoRef, rkey: u.Rkey.String(), uri: st.URI, following: o.spec.Record.URI != ""}
	read, value, err := r.getRecord(ctx, repo, u.Rkey.String())
	if err != nil {
		setCondition(o, v1alpha1.ConditionSynced, false, infra.ReasonSyncUnavailable, err.Error(), p.now)
		return false, nil
	}
	b.read, b.value = read, value
	if read.Found && o.spec.ClusterRef != nil && o.spec.Record.Sync == v1alpha1.RecordSyncPublish {
		// A cluster's node Infra is deleted with its last node (docs/nodes.md section 11):
		// its published record goes with it rather than staying ended, so a cluster that
		// scales from zero again and again does not leave a record per cycle in its owner's
		// repo. The swap is the cid just read; a write in between is read again next pass.
		cid := read.CID
		if err := repo.Delete(ctx, r.Kind.Collection(), u.Rkey.String(), &cid); err != nil {
			return false, fmt.Errorf("deleting the record %s of a cluster Infra: %w", st.URI, err)
		}
		r.log().Info("infra_record_deleted_with_cluster", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", st.URI)
	} else if read.Found && !read.Ended && read.Invalid == nil {
		// The final render: phase ended, endedAt the deletion time, endReason deleted (or the
		// ephemeral end already recorded), against the cid just read.
		if err := r.writeRecord(ctx, p, b, read.CID, true); err != nil {
			return false, err
		}
		return false, nil
	}
	endedAt, reason := o.obj.GetDeletionTimestamp().Time, infra.EndReasonDeleted
	if o.status.EndedAt != nil {
		endedAt, reason = o.status.EndedAt.Time, o.status.EndReason
	}
	if err := r.indexUpdate(ctx, repo, p.now, func(idx *atinfra.InfraIndex) (*atinfra.InfraIndex, bool) {
		return infra.IndexEnd(idx, r.Kind.Collection(), u.Rkey.String(), endedAt, reason, p.now)
	}); err != nil {
		return false, fmt.Errorf("index end of %s: %w", st.URI, err)
	}
	return true, nil
}
