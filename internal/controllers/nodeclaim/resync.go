package nodeclaim

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
)

// Resync sweeps the cluster Infras of the contract workspace once, at start: an Infra whose
// Cluster is gone is deleted, and an entry whose claim is gone (or was recreated: another
// uid) is dropped, with its join bundle. It covers what happened while no controller ran;
// afterwards the events do. It reads the API server directly.
func (r *Reconciler) Resync(ctx context.Context) error {
	var list v1alpha1.InfraList
	if err := r.reader().List(ctx, &list, client.InNamespace(r.contractNamespace()), client.HasLabels{v1alpha1.LabelInfraCluster}); err != nil {
		return fmt.Errorf("listing cluster Infras: %w", err)
	}
	var errs []error
	for i := range list.Items {
		inf := &list.Items[i]
		if !inf.DeletionTimestamp.IsZero() || inf.Spec.ClusterRef == nil {
			continue
		}
		if err := r.resyncInfra(ctx, inf); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Reconciler) resyncInfra(ctx context.Context, inf *v1alpha1.Infra) error {
	ref := *inf.Spec.ClusterRef
	p := &pass{claim: &v1alpha1.NodeClaim{Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: ref.Name}}},
		home: ref.Namespace, infraKey: types.NamespacedName{Namespace: inf.Namespace, Name: inf.Name}}
	var c v1alpha1.Cluster
	err := r.reader().Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, &c)
	switch {
	case apierrors.IsNotFound(err):
		return r.deleteInfra(ctx, p, "resync: cluster gone")
	case err != nil:
		return fmt.Errorf("reading Cluster %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	claims := map[string]string{}
	for _, n := range inf.Spec.Nodes {
		if n.NodeClaimRef == nil {
			continue
		}
		k := claimKey(inf.Namespace, n.NodeClaimRef)
		var claim v1alpha1.NodeClaim
		err := r.reader().Get(ctx, k, &claim)
		switch {
		case err == nil:
			claims[n.NodeClaimRef.Namespace+"/"+n.NodeClaimRef.Name] = string(claim.UID)
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("reading NodeClaim %s: %w", k, err)
		}
	}
	var errs []error
	for _, entry := range infra.StaleNodeEntries(inf.Spec, claims) {
		p.entry = entry
		if err := r.writeEntry(ctx, p, nil); err != nil && !errors.Is(err, ErrInfraDeleting) {
			errs = append(errs, err)
			continue
		}
		if err := r.removeBundle(ctx, p); err != nil {
			errs = append(errs, err)
		}
		r.log().Info("nodeclaim_entry_dropped", "infra", p.infraKey.String(), "entry", entry, "reason", "resync: claim gone")
	}
	return errors.Join(errs...)
}
