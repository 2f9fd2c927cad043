package nodeclaim

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/tenant"
)

// SecretTypeNodeJoin is the type of a join bundle Secret.
const SecretTypeNodeJoin corev1.SecretType = "socialweb.computer/node-join"

// ensureBundle makes sure the claim's join bundle Secret exists in the contract workspace,
// minting it when it does not. The Secret is written before the entry becomes Requested, so
// the RFP goes out only once the guest's credentials are there. A claim that ended gets no
// new bundle. A cluster that cannot mint yet (never started, or no tenant control planes in
// this process) leaves p.bundle nil and says why in p.message: the entry stays Staged.
func (r *Reconciler) ensureBundle(ctx context.Context, p *pass) error {
	name := infra.NodeBundleSecretName(p.infraKey.Name, p.entry)
	key := types.NamespacedName{Namespace: p.infraKey.Namespace, Name: name}
	var s corev1.Secret
	err := r.reader().Get(ctx, key, &s)
	switch {
	case err == nil:
		p.bundle, p.server = &v1alpha1.SecretKeyRef{Name: name}, string(s.Data[tenant.BundleKeyServer])
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading join bundle %s: %w", key, err)
	case infra.NodeClaimEnded(p.claim.Status.Phase):
		return nil
	}
	if r.Bundler == nil {
		p.message = ErrNoBundler.Error()
		return nil
	}
	b, err := r.Bundler.MintNodeBundle(p.clusterKey(), p.claim.Spec.NodeName)
	if errors.Is(err, tenant.ErrNoCA) {
		p.message = "waiting for the cluster to mint a join bundle: " + err.Error()
		return nil
	}
	if errors.Is(err, tenant.ErrNodeRevoked) {
		// A released name never joins again: the claim stays Staged and says why.
		p.message = "no join bundle: " + err.Error() + "; claim another node name"
		return nil
	}
	if err != nil {
		return fmt.Errorf("minting the join bundle of %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
	}
	s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
		Labels: map[string]string{v1alpha1.LabelInfraName: p.infraKey.Name, v1alpha1.LabelInfraContract: p.entry}},
		Type: SecretTypeNodeJoin, Data: b.Data()}
	if err := r.Client.Create(ctx, &s); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("writing join bundle %s: %w", key, err)
	}
	r.log().Info("nodeclaim_bundle_written", "claim", p.claim.Namespace+"/"+p.claim.Name, "secret", key.String())
	p.bundle, p.server = &v1alpha1.SecretKeyRef{Name: name}, b.Server
	return nil
}

// removeBundle deletes the claim's join bundle.
func (r *Reconciler) removeBundle(ctx context.Context, p *pass) error {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p.infraKey.Namespace, Name: infra.NodeBundleSecretName(p.infraKey.Name, p.entry)}}
	if err := r.Client.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting join bundle %s: %w", s.Name, err)
	}
	return nil
}
