package nodeclaim

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/tenant"
)

// locks holds one mutex per Infra, so the claims of one cluster write its spec in turn.
type locks struct {
	mu sync.Mutex
	m  map[types.NamespacedName]*sync.Mutex
}

func (l *locks) lock(k types.NamespacedName) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[types.NamespacedName]*sync.Mutex{}
	}
	m, ok := l.m[k]
	if !ok {
		m = &sync.Mutex{}
		l.m[k] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// declare composes the claim's entry (Staged until its bundle is written, then Requested)
// and writes it. A claim that ended only sets its entry, if it has one, Released: the entry
// keeps the node fields and bundle its contract was made with.
func (r *Reconciler) declare(ctx context.Context, p *pass) error {
	state := infra.NodeEntryState(false, p.claim.Status.Phase, p.bundle != nil)
	if state == v1alpha1.ContractReleased {
		return r.setEntryState(ctx, p, state)
	}
	return r.writeEntry(ctx, p, r.entryOf(p, state))
}

// entryOf is the claim's entry in the given state.
func (r *Reconciler) entryOf(p *pass, state v1alpha1.ContractState) *infra.NodeEntry {
	c := p.claim
	e := &infra.NodeEntry{Name: p.entry, State: state, VMName: c.Spec.NodeName, Bundle: p.bundle,
		CPUs: c.Spec.CPUs, MemMiB: c.Spec.MemMiB,
		Node: v1alpha1.InfraContractNode{OwnerDid: c.Spec.OwnerDid, Adopt: c.Spec.Adopt,
			NodeClaimRef: &v1alpha1.ObjectRef{Namespace: c.Namespace, Name: c.Name}}}
	if p.bundle != nil {
		ref := *p.bundle
		// The node registers closed to pods until the node host opens it (nodehost/open.go).
		e.Node.NodeJoin = &v1alpha1.NodeJoin{Server: p.server, NodeName: c.Spec.NodeName, BundleSecretRef: &ref,
			Taints: []string{v1alpha1.TaintNodeUnregistered + ":" + string(corev1.TaintEffectNoSchedule)}}
	}
	e.PolicyArgs = map[string]string{}
	if r.BidWindow > 0 {
		e.PolicyArgs[market.ArgBidWindow] = strconv.FormatFloat(r.BidWindow.Seconds(), 'f', -1, 64)
	}
	e.RequireLayers = requiredLayers(p.cluster)
	if p.cluster != nil {
		e.RequireIsolation = p.cluster.Spec.NodeIsolation
		e.RequireArch = p.cluster.Spec.NodeArch
	}
	if mp := priceCap(p.cluster, c); mp != nil {
		e.PolicyArgs[market.ArgMaxCost] = strconv.FormatInt(mp.Cost, 10)
		e.PolicyArgs[market.ArgCurrency] = mp.Currency
	}
	if len(e.PolicyArgs) == 0 {
		e.PolicyArgs = nil
	}
	return e
}

// requiredLayers are the layers a node of cluster must run: pod-user-namespaces when its
// control plane runs every pod in a user namespace (a node that cannot would fail them all).
func requiredLayers(cluster *v1alpha1.Cluster) []string {
	if cluster != nil && cluster.Status.PodUserNamespaces == string(tenant.PodUserNamespacesRequired) {
		return []string{substrate.LayerPodUserNamespaces}
	}
	return nil
}

// setEntryState changes only the state of the claim's entry as the Infra holds it (a
// release keeps the bundle and node fields the entry already has); no entry, no write.
func (r *Reconciler) setEntryState(ctx context.Context, p *pass, state v1alpha1.ContractState) error {
	return r.writeInfra(ctx, p, func(spec v1alpha1.InfraSpec) (*infra.NodeEntry, bool) {
		e, ok := infra.NodeEntryOf(spec, p.entry)
		if !ok {
			return nil, false
		}
		e.State = state
		return e, true
	})
}

// writeEntry writes want as the claim's entry; nil drops it.
func (r *Reconciler) writeEntry(ctx context.Context, p *pass, want *infra.NodeEntry) error {
	return r.writeInfra(ctx, p, func(v1alpha1.InfraSpec) (*infra.NodeEntry, bool) { return want, true })
}

// writeInfra is the one way the Infra's spec is written: under the Infra's lock, read it
// straight from the API server, compose this claim's entry into it (change says what the
// entry becomes, or that there is nothing to write) and the record binding the Cluster asks
// for (binding), and update the whole spec with the
// resourceVersion read (an optimistic lock: a conflict reads again). A missing Infra is
// created; one with no entry left is deleted, with preconditions on the uid and version
// just written, so an entry added in between is never deleted with it.
func (r *Reconciler) writeInfra(ctx context.Context, p *pass, change func(v1alpha1.InfraSpec) (*infra.NodeEntry, bool)) error {
	bind, bindKnown := r.binding(ctx, p)
	unlock := r.locks.lock(p.infraKey)
	defer unlock()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var inf v1alpha1.Infra
		err := r.reader().Get(ctx, p.infraKey, &inf)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Infra %s: %w", p.infraKey, err)
		}
		exists := err == nil
		if exists && !inf.DeletionTimestamp.IsZero() {
			p.infra = &inf
			return fmt.Errorf("writing Infra %s: %w", p.infraKey, ErrInfraDeleting)
		}
		want, write := change(inf.Spec)
		if !write {
			if exists {
				p.infra = &inf
			}
			p.state = stateIn(inf.Spec, p.entry, exists)
			return nil
		}
		spec := infra.ComposeNodeEntry(inf.Spec, p.clusterInfra(), p.entry, want)
		if bindKnown {
			spec.Record = bind
		}
		switch {
		case !exists && len(spec.Contracts) == 0:
			p.infra, p.state = nil, ""
			return nil
		case !exists:
			inf = v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: p.infraKey.Namespace, Name: p.infraKey.Name,
				Labels: map[string]string{v1alpha1.LabelInfraCluster: infra.LabelValue(p.claim.Spec.ClusterRef.Name)}}, Spec: spec}
			if err := r.Client.Create(ctx, &inf, client.FieldOwner(FieldManager)); err != nil {
				if apierrors.IsAlreadyExists(err) {
					return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("infras").GroupResource(), p.infraKey.Name, err)
				}
				return fmt.Errorf("creating Infra %s: %w", p.infraKey, err)
			}
			r.log().Info("nodeclaim_infra_created", "infra", p.infraKey.String(), "claim", p.claim.Name, "entry", p.entry)
		case !equality.Semantic.DeepEqual(spec, inf.Spec):
			if (spec.Record == nil) != (inf.Spec.Record == nil) {
				r.log().Info("nodeclaim_infra_record_binding", "infra", p.infraKey.String(), "publish", spec.Record != nil)
			}
			inf.Spec = spec
			if err := r.Client.Update(ctx, &inf, client.FieldOwner(FieldManager)); err != nil {
				return fmt.Errorf("writing Infra %s: %w", p.infraKey, err)
			}
		}
		p.infra, p.state = &inf, stateIn(inf.Spec, p.entry, true)
		if len(inf.Spec.Contracts) == 0 {
			uid, rv := inf.UID, inf.ResourceVersion
			if err := r.Client.Delete(ctx, &inf, client.Preconditions{UID: &uid, ResourceVersion: &rv}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting Infra %s: %w", p.infraKey, err)
			}
			r.log().Info("nodeclaim_infra_deleted", "infra", p.infraKey.String(), "reason", "last entry dropped")
			p.infra = nil
		}
		return nil
	})
}

func stateIn(spec v1alpha1.InfraSpec, entry string, exists bool) v1alpha1.ContractState {
	if !exists {
		return ""
	}
	if e, ok := infra.NodeEntryOf(spec, entry); ok {
		if e.State == "" {
			return v1alpha1.ContractStaged
		}
		return e.State
	}
	return ""
}
