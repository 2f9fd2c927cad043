package nodehost

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/tenant"
)

// ClaimLabel marks a tenant Node as provided by a NodeClaim (its value is the claim's
// name). The node host sets it once it sees the claim's node registered; a Node that carries
// it while no claim names it is a ghost: its guest was released while the control plane
// could not be told (the cluster was stopped with spec.running false, or the claim's
// finalizer ran while the apiserver was down). Nodes without the label (joined by hand) are
// never touched, as Karpenter leaves nodes it does not manage alone.
const ClaimLabel = "node.socialweb.computer/claim"

// nodeUpkeep is what to do about the tenant's Nodes: label the claimed ones, remove ghosts.
type nodeUpkeep struct {
	// Label maps node name to the claim to name in ClaimLabel.
	Label map[string]string
	// Ghosts are the labelled nodes no claim names, sorted.
	Ghosts []string
}

// upkeepOf decides nodeUpkeep from the tenant's Nodes and the Cluster's claims (a claim
// being deleted still names its node: its own finalizer removes it).
func upkeepOf(nodes []*corev1.Node, claims []*v1alpha1.NodeClaim) nodeUpkeep {
	claimOf := map[string]string{}
	for _, c := range claims {
		if c.Spec.NodeName != "" {
			claimOf[c.Spec.NodeName] = c.Name
		}
	}
	u := nodeUpkeep{Label: map[string]string{}}
	for _, n := range nodes {
		claim, claimed := claimOf[n.Name]
		v, labelled := n.Labels[ClaimLabel]
		switch {
		case claimed && v != claim:
			u.Label[n.Name] = claim
		case !claimed && labelled:
			u.Ghosts = append(u.Ghosts, n.Name)
		}
	}
	sort.Strings(u.Ghosts)
	return u
}

// upkeep labels the claimed nodes and deletes the ghosts (and the pods bound to them, which
// run nowhere) from the tenant cluster.
func (r *Reconciler) upkeep(ctx context.Context, p *pass, w *tenantWatch, nodes []*corev1.Node) error {
	u := upkeepOf(nodes, p.claims)
	for name, claim := range u.Label {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]string{ClaimLabel: claim}}})
		if _, err := w.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("labelling node %s of cluster %s: %w", name, p.key, err)
		}
	}
	for _, name := range u.Ghosts {
		if err := tenant.DeleteNodeAndPods(ctx, w.client, name); err != nil {
			return fmt.Errorf("removing ghost node %s of cluster %s: %w", name, p.key, err)
		}
		r.Log.Info("nodehost_ghost_node_removed", "cluster", p.key.String(), "node", name,
			"why", "labelled "+ClaimLabel+" and no NodeClaim names it")
	}
	return nil
}
