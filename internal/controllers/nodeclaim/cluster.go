package nodeclaim

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// clusterGone: the claim's Cluster is deleting or gone. Its Infra is deleted, whole and at
// once (its release finalizer releases every node in the plan 0028 order), and never
// written again for this Cluster; the claim reports what its contract does meanwhile.
func (r *Reconciler) clusterGone(ctx context.Context, p *pass) error {
	if err := r.deleteInfra(ctx, p, "cluster deleted"); err != nil {
		return err
	}
	// The Infra's finalizer releases the entry's contract: for the claim it is Released.
	p.state = v1alpha1.ContractReleased
	p.message = "the cluster is deleted; its Infra releases every node"
	return nil
}

// deleteInfra deletes the claim's Infra unless it is already going.
func (r *Reconciler) deleteInfra(ctx context.Context, p *pass, reason string) error {
	var inf v1alpha1.Infra
	err := r.reader().Get(ctx, p.infraKey, &inf)
	switch {
	case apierrors.IsNotFound(err):
		p.infra = nil
		return nil
	case err != nil:
		return fmt.Errorf("reading Infra %s: %w", p.infraKey, err)
	}
	p.infra = &inf
	p.state = stateIn(inf.Spec, p.entry, true)
	if !inf.DeletionTimestamp.IsZero() {
		return nil
	}
	if err := r.Client.Delete(ctx, &inf); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Infra %s: %w", p.infraKey, err)
	}
	r.log().Info("nodeclaim_infra_deleted", "infra", p.infraKey.String(), "reason", reason)
	return nil
}
