package nodeclaim

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
)

// binding is the record binding the claim's Infra is to carry (infra.ClusterRecordBinding:
// the owner's repo with sync Publish while the Cluster opted in, else none), and whether this
// pass knows it: only a pass that read its Cluster live does. A pass without the Cluster (the
// resync) or with one being deleted leaves the binding as the Infra holds it, so the Infra's
// final record write still goes where the record is.
//
// Opting in makes the owner's AtprotoRepo in the contract workspace when it is missing: an
// account of the embedded PDS (spec.local.account the owner's DID), the one kind of repo
// this process can write for another account without holding its credentials. An owner
// whose account is on another PDS gets a repo that never connects, and the Infra reports
// Synced False RecordUnavailable: nothing is published. An operator who holds that owner's
// app password makes owner-<hash> beforehand with spec.remote; one that exists is left as
// it is.
func (r *Reconciler) binding(ctx context.Context, p *pass) (*v1alpha1.InfraRecordBinding, bool) {
	if p.cluster == nil || !p.cluster.DeletionTimestamp.IsZero() {
		return nil, false
	}
	b := infra.ClusterRecordBinding(p.cluster)
	if b != nil {
		// A repo that cannot be made must not hold the nodes up: the binding is written
		// anyway, the Infra reports Synced False RecordUnavailable, and the next pass tries
		// again.
		if err := r.ensureOwnerRepo(ctx, p.cluster.Spec.Account); err != nil {
			r.log().Warn("nodeclaim_owner_repo_failed", "account", p.cluster.Spec.Account, "error", err)
		}
	}
	return b, true
}

// ensureOwnerRepo makes the owner's AtprotoRepo (infra.OwnerRepoName) in the contract
// workspace unless one exists (read from the cache: one the cache has not seen yet answers
// AlreadyExists to the create, which is fine).
func (r *Reconciler) ensureOwnerRepo(ctx context.Context, did string) error {
	key := types.NamespacedName{Namespace: r.contractNamespace(), Name: infra.OwnerRepoName(did)}
	var repo v1alpha1.AtprotoRepo
	err := r.Client.Get(ctx, key, &repo)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading AtprotoRepo %s: %w", key, err)
	}
	repo = v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: did}}}
	switch err := r.Client.Create(ctx, &repo); {
	case apierrors.IsAlreadyExists(err):
	case err != nil:
		return fmt.Errorf("creating AtprotoRepo %s: %w", key, err)
	default:
		r.log().Info("nodeclaim_owner_repo_created", "repo", key.String(), "account", did)
	}
	return nil
}
