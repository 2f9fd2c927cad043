package nodehost

import (
	"context"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/clusternet"
)

// ReasonNodeAddressShared is the Warning event on a tenant Node replaced because another
// node of its cluster has its address.
const ReasonNodeAddressShared = "NodeAddressShared"

// SharedAddresses are the claimed nodes, still closed (TaintNodeUnregistered), whose
// InternalIP another node of the cluster has, each mapped to that node. Such a node is
// replaced rather than opened: a node's InternalIP is its link on its own host, every host
// draws links from the same range, and the apiserver reaches a kubelet by that address
// only, so of two nodes on two hosts with one address neither could be reached for logs,
// exec or metrics (the tunnel refuses to guess between them).
//
// Only a claimed node still closed is replaced: nodes already open (they may run pods),
// joined by hand (no claim names them) or whose claim is going are kept, and of the others
// sharing their address the oldest (then the first by name) is kept when none of those is.
func SharedAddresses(nodes []*corev1.Node, claims []*v1alpha1.NodeClaim) map[string]string {
	claimed := map[string]bool{}
	for _, c := range claims {
		if c.Spec.NodeName != "" && c.DeletionTimestamp == nil {
			claimed[c.Spec.NodeName] = true
		}
	}
	byAddress := map[netip.Addr][]*corev1.Node{}
	for _, n := range nodes {
		if a, ok := clusternet.NodeInternalIP(n); ok {
			byAddress[a] = append(byAddress[a], n)
		}
	}
	shared := map[string]string{}
	for _, group := range byAddress {
		if len(group) < 2 {
			continue
		}
		replaceable := func(n *corev1.Node) bool { return claimed[n.Name] && unregistered(n) }
		sort.Slice(group, func(i, j int) bool {
			a, b := group[i], group[j]
			if ra, rb := replaceable(a), replaceable(b); ra != rb {
				return rb
			}
			if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
				return a.CreationTimestamp.Before(&b.CreationTimestamp)
			}
			return a.Name < b.Name
		})
		for _, n := range group[1:] {
			if replaceable(n) {
				shared[n.Name] = group[0].Name
			}
		}
	}
	return shared
}

// replaceShared deletes the claims of the nodes SharedAddresses names (their contracts are
// released; a pod still pending gets a node of a new claim, whose address is drawn afresh),
// says why on each Node, and returns the nodes without them: the rest of the pass neither
// opens them nor places pods on them.
func (r *Reconciler) replaceShared(ctx context.Context, p *pass, w *tenantWatch, nodes []*corev1.Node) ([]*corev1.Node, error) {
	shared := SharedAddresses(nodes, p.claims)
	if len(shared) == 0 {
		return nodes, nil
	}
	now := metav1.NewTime(r.now())
	for _, c := range p.claims {
		other, ok := shared[c.Spec.NodeName]
		if !ok || c.DeletionTimestamp != nil {
			continue
		}
		if err := deleteClaim(ctx, r.Client, c); err != nil {
			return nil, err
		}
		c.DeletionTimestamp = &now // as the API server now has it, for the rest of the pass
		for _, n := range nodes {
			if n.Name != c.Spec.NodeName {
				continue
			}
			a, _ := clusternet.NodeInternalIP(n)
			w.events.Eventf(n, corev1.EventTypeWarning, ReasonNodeAddressShared,
				"address %s is also node %s's (nodes rented on different hosts); this node is released and another rented", a, other)
			r.Log.Info("nodehost_node_address_shared", "cluster", p.key.String(), "node", n.Name, "claim", c.Name,
				"address", a.String(), "other", other)
		}
	}
	kept := make([]*corev1.Node, 0, len(nodes))
	for _, n := range nodes {
		if _, ok := shared[n.Name]; !ok {
			kept = append(kept, n)
		}
	}
	return kept, nil
}
