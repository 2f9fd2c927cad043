package nodeclaim

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/quota/ledger"
)

// finalize is the release finalizer of a deleted claim:
//
//  0. the node's credentials are revoked in its cluster, first and on every pass: from the
//     claim's deletion on, whoever holds the node's bundle or certificates (its bidder, a
//     tenant inside the guest) can no longer act as the node, register it again, renew its
//     certificate or hold a tunnel of the cluster;
//  1. its entry is set Released (the Infra controller sets spec.release on the contract);
//  2. while the contract is not finished (Released or Failed) the claim waits, woken by the
//     contract's events; a claim that had already ended (Failed, Lost) does not wait: the
//     Infra keeps the release going after the entry is dropped;
//  3. the node's object is deleted from the tenant cluster (its guest is gone, so no kubelet
//     registers it again), and so are the pods still bound to it, which run nowhere now (a
//     cluster that is not Ready, deleting or gone is skipped: there is no apiserver to ask,
//     and a deleted cluster takes its nodes along);
//  4. the entry is dropped (the Infra controller deletes the finished contract; the last
//     entry deletes the Infra), the join bundle is deleted, the claim's status says Released
//     (or Failed), and the finalizer goes.
//
// An Infra being deleted (its Cluster went) is not written: its own finalizer releases the
// contract, and the claim waits for that the same way.
func (r *Reconciler) finalize(ctx context.Context, p *pass) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(p.claim, v1alpha1.FinalizerNodeClaimRelease) {
		return reconcile.Result{}, nil
	}
	if err := r.readCluster(ctx, p); err != nil {
		return done(ctx, err)
	}
	if err := r.revokeNode(p); err != nil {
		return done(ctx, err)
	}
	if err := r.setEntryState(ctx, p, v1alpha1.ContractReleased); err != nil && !errors.Is(err, ErrInfraDeleting) {
		return done(ctx, err)
	}
	cc, err := r.contract(ctx, p)
	if err != nil {
		return done(ctx, err)
	}
	ended := p.claim.Status.Phase == v1alpha1.NodeClaimFailed || p.claim.Status.Phase == v1alpha1.NodeClaimLost
	if cc != nil && !infra.Finished(cc.Status.Phase) && !ended {
		p.message = "releasing the node's guest"
		if err := r.writeStatus(ctx, p); err != nil {
			return done(ctx, err)
		}
		return reconcile.Result{}, nil
	}
	if err := r.deleteNode(ctx, p); err != nil {
		return done(ctx, err)
	}
	if err := r.writeEntry(ctx, p, nil); err != nil && !errors.Is(err, ErrInfraDeleting) {
		return done(ctx, err)
	}
	if err := r.removeBundle(ctx, p); err != nil {
		return done(ctx, err)
	}
	// The node is gone: its time goes into the owner's node-time ledger before the claim
	// does, so node-hours still count it (internal/quota/ledger).
	if did := p.claim.Spec.OwnerDid; did != "" {
		iv := quota.Interval{From: p.claim.CreationTimestamp.Time, To: time.Now()}
		if err := ledger.Record(ctx, r.Client, r.reader(), p.claim.Namespace, did, string(p.claim.UID), iv, iv.To); err != nil {
			return done(ctx, fmt.Errorf("recording the node time of %s/%s: %w", p.claim.Namespace, p.claim.Name, err))
		}
	}
	// The entry is gone; the claim reports how its release ended.
	p.state, p.message = v1alpha1.ContractReleased, ""
	if err := r.writeStatus(ctx, p); err != nil {
		return done(ctx, err)
	}
	if _, err := reconcilekit.RemoveFinalizer(ctx, r.Client, p.claim, v1alpha1.FinalizerNodeClaimRelease); err != nil && !apierrors.IsNotFound(err) {
		return reconcilekit.Settle(ctx, fmt.Errorf("removing finalizer of %s/%s: %w", p.claim.Namespace, p.claim.Name, err))
	}
	r.log().Info("nodeclaim_released", "claim", p.claim.Namespace+"/"+p.claim.Name, "entry", p.entry, "phase", p.claim.Status.Phase)
	r.index.forget(p)
	return reconcile.Result{}, nil
}

// deleteNode deletes the claim's Node from its tenant cluster once the guest is released, as
// long as the cluster is Ready to answer: without it the Node would stay registered (Ready
// until its lease ran out, then NotReady for good) after its node is gone.
func (r *Reconciler) deleteNode(ctx context.Context, p *pass) error {
	c := p.cluster
	if r.Nodes == nil || c == nil || !c.DeletionTimestamp.IsZero() || c.Status.Phase != v1alpha1.ClusterReady {
		return nil
	}
	if err := r.Nodes.DeleteNode(ctx, p.clusterKey(), p.claim.Spec.NodeName); err != nil {
		return fmt.Errorf("deleting node %s from cluster %s: %w", p.claim.Spec.NodeName, p.clusterKey(), err)
	}
	r.log().Info("nodeclaim_node_deleted", "claim", p.claim.Namespace+"/"+p.claim.Name, "node", p.claim.Spec.NodeName)
	return nil
}

// revokeNode revokes the claim's node in its cluster (tenant.Manager.RevokeNode). A cluster
// gone or being deleted is revoked too: its directory goes with it, and until then its
// apiserver may still answer.
func (r *Reconciler) revokeNode(p *pass) error {
	if r.Nodes == nil || p.claim.Spec.NodeName == "" {
		return nil
	}
	if err := r.Nodes.RevokeNode(p.clusterKey(), p.claim.Spec.NodeName); err != nil {
		return fmt.Errorf("revoking node %s in cluster %s: %w", p.claim.Spec.NodeName, p.clusterKey(), err)
	}
	return nil
}
