package nodehost

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// releaseAll deletes every claim of a Cluster that is not running or is being deleted: a
// stopped control plane keeps no node. The nodes are not cordoned (the tenant apiserver is
// stopped or going); their guests are released by the NodeClaim controller.
func (r *Reconciler) releaseAll(ctx context.Context, p *pass) error {
	n := 0
	for _, c := range p.claims {
		if c.DeletionTimestamp != nil {
			continue
		}
		if err := deleteClaim(ctx, r.Client, c); err != nil {
			return err
		}
		n++
	}
	reason, why := ReasonStopped, "spec.running is false"
	if !p.cluster.DeletionTimestamp.IsZero() {
		reason, why = ReasonDeleting, "the cluster is being deleted"
	}
	p.outcome = outcome{reason: reason, message: fmt.Sprintf("%s: every node is released", why)}
	if n > 0 {
		r.Log.Info("nodehost_release_all", "cluster", p.key.String(), "claims", n, "why", why)
	}
	return nil
}

// releaseOrphans deletes the claims naming a Cluster that does not exist.
func (r *Reconciler) releaseOrphans(ctx context.Context, cluster types.NamespacedName) error {
	claims, err := r.claimsNaming(ctx, cluster)
	if err != nil {
		return err
	}
	for _, c := range claims {
		if c.DeletionTimestamp != nil {
			continue
		}
		if err := deleteClaim(ctx, r.Client, c); err != nil {
			return err
		}
		r.Log.Info("nodehost_release_orphan", "cluster", cluster.String(), "claim", c.Name)
	}
	return nil
}
