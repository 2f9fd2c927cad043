package nodeclaim

import (
	"context"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// index maps a ComputeContract and an Infra to the claims they serve, learned on each
// reconcile. It finds a claim when the Infra that named it is already gone (deleted with
// its Cluster); the Infra's spec.nodes is the other way, for claims not reconciled since
// this process started.
type index struct {
	mu        sync.Mutex
	contracts map[types.NamespacedName]types.NamespacedName
	infras    map[types.NamespacedName]map[types.NamespacedName]bool
}

func (x *index) learn(p *pass) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.contracts == nil {
		x.contracts = map[types.NamespacedName]types.NamespacedName{}
		x.infras = map[types.NamespacedName]map[types.NamespacedName]bool{}
	}
	claim := types.NamespacedName{Namespace: p.claim.Namespace, Name: p.claim.Name}
	x.contracts[types.NamespacedName{Namespace: p.infraKey.Namespace, Name: p.contract}] = claim
	if x.infras[p.infraKey] == nil {
		x.infras[p.infraKey] = map[types.NamespacedName]bool{}
	}
	x.infras[p.infraKey][claim] = true
}

func (x *index) forget(p *pass) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.contracts, types.NamespacedName{Namespace: p.infraKey.Namespace, Name: p.contract})
	delete(x.infras[p.infraKey], types.NamespacedName{Namespace: p.claim.Namespace, Name: p.claim.Name})
	if len(x.infras[p.infraKey]) == 0 {
		delete(x.infras, p.infraKey)
	}
}

func (x *index) claimsOf(infraKey types.NamespacedName, contract *types.NamespacedName) []reconcile.Request {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []reconcile.Request
	if contract != nil {
		if c, ok := x.contracts[*contract]; ok {
			out = append(out, reconcile.Request{NamespacedName: c})
		}
	}
	for c := range x.infras[infraKey] {
		if contract == nil {
			out = append(out, reconcile.Request{NamespacedName: c})
		}
	}
	return out
}

// claimsOfContract wakes the claim a ComputeContract serves: from the index, else from its
// Infra's spec.nodes (the contract's labels name the Infra and the entry).
func (r *Reconciler) claimsOfContract(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetLabels()[v1alpha1.LabelInfraKind] != "Infra" {
		return nil
	}
	infraKey := types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetLabels()[v1alpha1.LabelInfraName]}
	ck := types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
	if out := r.index.claimsOf(infraKey, &ck); len(out) > 0 {
		return out
	}
	var inf v1alpha1.Infra
	if err := r.Client.Get(ctx, infraKey, &inf); err != nil {
		return nil
	}
	entry := o.GetLabels()[v1alpha1.LabelInfraContract]
	var out []reconcile.Request
	for _, n := range inf.Spec.Nodes {
		if n.Contract == entry && n.NodeClaimRef != nil {
			out = append(out, reconcile.Request{NamespacedName: claimKey(inf.Namespace, n.NodeClaimRef)})
		}
	}
	return out
}

// claimsOfInfra wakes every claim an Infra serves (its status moved, or it went).
func (r *Reconciler) claimsOfInfra(_ context.Context, o client.Object) []reconcile.Request {
	inf, ok := o.(*v1alpha1.Infra)
	if !ok || inf.Spec.ClusterRef == nil && o.GetLabels()[v1alpha1.LabelInfraCluster] == "" {
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var out []reconcile.Request
	add := func(k types.NamespacedName) {
		if !seen[k] {
			seen[k] = true
			out = append(out, reconcile.Request{NamespacedName: k})
		}
	}
	for _, n := range inf.Spec.Nodes {
		if n.NodeClaimRef != nil {
			add(claimKey(inf.Namespace, n.NodeClaimRef))
		}
	}
	for _, req := range r.index.claimsOf(types.NamespacedName{Namespace: inf.Namespace, Name: inf.Name}, nil) {
		add(req.NamespacedName)
	}
	return out
}

// claimsOfCluster wakes the claims of a Cluster (it is being deleted, or came back).
func (r *Reconciler) claimsOfCluster(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.NodeClaimList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, c := range list.Items {
		home := c.Spec.ClusterRef.Namespace
		if home == "" {
			home = c.Namespace
		}
		if home == o.GetNamespace() && c.Spec.ClusterRef.Name == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
		}
	}
	return out
}

func claimKey(ns string, ref *v1alpha1.ObjectRef) types.NamespacedName {
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	return types.NamespacedName{Namespace: ns, Name: ref.Name}
}
