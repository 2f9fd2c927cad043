package nodehost

import (
	"context"
	"errors"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/tenant"
)

// ControllerName names the node host in logs and metrics.
const ControllerName = "nodehost"

// Errors a reconcile can end with.
var (
	// ErrNoTenants: the node host was set up without a way to reach tenant clusters.
	ErrNoTenants = errors.New("node host: no tenant clusters to reach")
	// ErrStopped: the controller is stopping; no tenant watch starts.
	ErrStopped = errors.New("node host: stopping")
)

// Reconciler reconciles Clusters: it decides their size and writes their NodeClaims.
type Reconciler struct {
	Client client.Client
	// Reader lists NodeClaims straight from the API server, so a decision never counts
	// from a cache that has not seen the claims the previous decision created; nil means
	// Client.
	Reader client.Reader
	// BatchIdle and BatchMax override the batching of pending pods (0: scale's defaults).
	BatchIdle, BatchMax time.Duration
	// EndedRetry is how long a Failed or Lost claim holds its place before it is deleted
	// (and the node claimed again if still needed); 0 means DefaultEndedRetry.
	EndedRetry time.Duration
	Log        *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Quota is what one account may hold: its nodes and node-hours quotas cut scale-ups.
	Quota quota.Limits

	watches watches
	ended   endedClaims
}

// DefaultEndedRetry is how long a claim that ended holds its place by default.
const DefaultEndedRetry = 30 * time.Second

func (r *Reconciler) endedRetry() time.Duration {
	if r.EndedRetry > 0 {
		return r.EndedRetry
	}
	return DefaultEndedRetry
}

// Options configure Setup.
type Options struct {
	// Tenants reaches tenant apiservers; required.
	Tenants             Tenants
	BatchIdle, BatchMax time.Duration
	// EndedRetry: see Reconciler.EndedRetry.
	EndedRetry time.Duration
	// Quota: see Reconciler.Quota.
	Quota    quota.Limits
	Log      *slog.Logger
	Observer manager.ReconcileObserver
}

// Setup registers the node host with m.
func Setup(m crmanager.Manager, o Options) error {
	if o.Tenants == nil {
		return ErrNoTenants
	}
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	r := &Reconciler{Client: m.GetClient(), Reader: m.GetAPIReader(), BatchIdle: o.BatchIdle, BatchMax: o.BatchMax,
		EndedRetry: o.EndedRetry, Quota: o.Quota, Log: log.With("controller", ControllerName)}
	r.watches.tenants = o.Tenants
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.Cluster{}).
		Watches(&v1alpha1.NodeClaim{}, handler.EnqueueRequestsFromMapFunc(clusterOfClaim)).
		WatchesRawSource(source.Func(r.watches.source)).
		WithOptions(manager.ControllerOptions(4)).
		Complete(manager.Observed(ControllerName, r, o.Observer))
}

// clusterOfClaim wakes the Cluster a NodeClaim names.
func clusterOfClaim(_ context.Context, o client.Object) []reconcile.Request {
	c, ok := o.(*v1alpha1.NodeClaim)
	if !ok {
		return nil
	}
	return []reconcile.Request{{NamespacedName: clusterKey(c)}}
}

func clusterKey(c *v1alpha1.NodeClaim) types.NamespacedName {
	ns := c.Spec.ClusterRef.Namespace
	if ns == "" {
		ns = c.Namespace
	}
	return types.NamespacedName{Namespace: ns, Name: c.Spec.ClusterRef.Name}
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

// pass is what one reconcile carries from step to step.
type pass struct {
	cluster *v1alpha1.Cluster
	stored  *v1alpha1.Cluster
	key     tenant.Key
	// claims are the Cluster's NodeClaims as listed from the API server.
	claims []*v1alpha1.NodeClaim
	// joined are the tenant's Ready nodes (nil when the tenant was not read).
	joined map[string]bool
	// nodes are the tenant's Nodes the decision read (nil when the tenant was not read).
	nodes []*corev1.Node
	// outcome is what the status reports.
	outcome outcome
	// openRecheck is when a node kept closed must be looked at again (NodesToOpen).
	openRecheck time.Duration
}

// outcome is what a reconcile did, for the Scaling condition.
type outcome struct {
	acting  bool
	reason  string
	message string
}

// Reconcile: read the Cluster and its claims; a Cluster not running or deleted releases
// every claim (release.go); a Ready one has its tenant watched (watch.go), its claimed Nodes
// labelled and its ghost Nodes removed (ghosts.go), a new node with another's address
// replaced (address.go), its claims that ended deleted, the
// decision taken (input.go) and applied (apply.go); the status is written once (status.go).
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := tenant.Key{Namespace: req.Namespace, Name: req.Name}
	var c v1alpha1.Cluster
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		// Gone (its teardown can end before a reconcile saw it deleting), or never there:
		// its claims have no cluster to join.
		r.watches.stop(key)
		r.ended.forget(key)
		return reconcile.Result{}, r.releaseOrphans(ctx, req.NamespacedName)
	}
	p := &pass{cluster: &c, stored: c.DeepCopy(), key: key}
	claims, err := r.claimsOf(ctx, &c)
	if err != nil {
		return reconcile.Result{}, err
	}
	p.claims = claims

	var result reconcile.Result
	switch {
	case !c.DeletionTimestamp.IsZero() || !c.Spec.Running:
		r.watches.stop(key)
		r.ended.forget(key)
		if err := r.releaseAll(ctx, p); err != nil {
			return reconcile.Result{}, err
		}
	case c.Status.Phase == v1alpha1.ClusterSleeping:
		// No node, no claim, no pod waiting for one: nothing to watch until it wakes.
		r.watches.stop(key)
		p.outcome = outcome{reason: ReasonAsleep, message: "the control plane is asleep; nothing to decide until a request wakes it"}
	case c.Status.Phase != v1alpha1.ClusterReady || c.Status.Instance == "":
		p.outcome = outcome{reason: ReasonControlPlaneNotReady, message: "waiting for the control plane to be Ready before deciding"}
	default:
		w, err := r.watches.ensure(&c)
		if err != nil {
			return reconcile.Result{}, err
		}
		if !w.hasSynced() {
			p.outcome = outcome{reason: ReasonReadingTenant, message: "reading the tenant cluster's pods and nodes"}
			result.RequeueAfter = 100 * time.Millisecond
			break
		}
		d, err := r.decide(ctx, p, w)
		if err != nil {
			return reconcile.Result{}, err
		}
		result.RequeueAfter = d.RequeueAfter
	}
	if err := r.writeStatus(ctx, p); err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	return result, nil
}

// Reasons of the Scaling condition besides the decision's own (ConditionReason of it).
const (
	ReasonStopped              = "Stopped"
	ReasonDeleting             = "Deleting"
	ReasonControlPlaneNotReady = "ControlPlaneNotReady"
	ReasonAsleep               = "Asleep"
	ReasonReadingTenant        = "ReadingTenant"
)

// claimsOf lists the Cluster's NodeClaims from the API server.
func (r *Reconciler) claimsOf(ctx context.Context, c *v1alpha1.Cluster) ([]*v1alpha1.NodeClaim, error) {
	return r.claimsNaming(ctx, types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
}

// claimsNaming lists the NodeClaims whose clusterRef names want, from the API server. Claims
// live in their Cluster's namespace (the node host creates them there); a claim elsewhere
// naming this Cluster is not looked for.
func (r *Reconciler) claimsNaming(ctx context.Context, want types.NamespacedName) ([]*v1alpha1.NodeClaim, error) {
	var list v1alpha1.NodeClaimList
	if err := r.reader().List(ctx, &list, client.InNamespace(want.Namespace)); err != nil {
		return nil, err
	}
	var out []*v1alpha1.NodeClaim
	for i := range list.Items {
		if clusterKey(&list.Items[i]) == want {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// decide reads the tenant, deletes the claims that ended, calls the decision and applies it.
func (r *Reconciler) decide(ctx context.Context, p *pass, w *tenantWatch) (scale.Decision, error) {
	pods, nodes, err := w.lists()
	if err != nil {
		return scale.Decision{}, err
	}
	pods, held := w.withVolumes(pods)
	if err := r.upkeep(ctx, p, w, nodes); err != nil {
		return scale.Decision{}, err
	}
	if nodes, err = r.replaceShared(ctx, p, w, nodes); err != nil {
		return scale.Decision{}, err
	}
	p.nodes = nodes
	p.joined = map[string]bool{}
	for _, n := range nodes {
		if NodeJoined(n) {
			p.joined[n.Name] = true
		}
	}
	retry, err := r.deleteEnded(ctx, p)
	if err != nil {
		return scale.Decision{}, err
	}
	s := SettingsOf(p.cluster)
	s.BatchIdle, s.BatchMax = r.BatchIdle, r.BatchMax
	in := InputOf(r.now(), pods, nodes, p.claims, s, r.watches.stateOf(w))
	r.watches.refinePending(w, in.Now, in.Pods)
	r.settleOwners(ctx, p, w, pods, in.Pods)
	in.Simulated = r.simulate(p, pods, nodes, s)
	if in.Simulated != nil {
		for key, why := range in.Simulated.Unplaced {
			if pv, ok := held[key]; ok {
				in.Simulated.Unplaced[key] = volumeReason(pv, why)
			}
		}
	}
	if in.Consolidatable, err = Consolidatable(pods, nodes, p.claims, s); err != nil {
		r.Log.Error("nodehost_consolidation_failed", "cluster", p.key.String(), "error", err.Error())
	}
	in.DisruptionBudget = DrainBudget(p.claims, s)
	if len(in.Consolidatable) == 0 {
		if in.Replacement, err = Replaceable(pods, nodes, p.claims, s); err != nil {
			r.Log.Error("nodehost_replacement_failed", "cluster", p.key.String(), "error", err.Error())
		}
	}
	d := scale.Decide(in)
	r.watches.setState(w, d.State)
	d, exceeded, err := r.applyQuota(ctx, p, d)
	if err != nil {
		return d, err
	}
	if err := r.apply(ctx, p, w, in, d); err != nil {
		return d, err
	}
	if exceeded != nil {
		// Room comes back without an event of this Cluster (a node of another cluster of
		// the account goes, node-hours leave the window): look again.
		if d.RequeueAfter == 0 || d.RequeueAfter > quotaRecheck {
			d.RequeueAfter = quotaRecheck
		}
		// The quota's word goes on the Scaling condition, whatever was provisioned.
		p.outcome.reason, p.outcome.message = ReasonQuotaExceeded, quotaMessage(exceeded)+"; "+p.outcome.message
		r.Log.Info("nodehost_quota_exceeded", "cluster", p.key.String(), "account", exceeded.Account, "quota", exceeded.Quota,
			"limit", exceeded.Limit, "used", exceeded.Used)
	}
	for _, after := range []time.Duration{retry, p.openRecheck} {
		if after > 0 && (d.RequeueAfter == 0 || after < d.RequeueAfter) {
			d.RequeueAfter = after
		}
	}
	return d, nil
}

// simulate runs the scheduling simulation for the decision (simulation.go); nil, and the
// decision counts slots, when the scheduler framework failed to build (logged).
func (r *Reconciler) simulate(p *pass, pods []*corev1.Pod, nodes []*corev1.Node, s Settings) *scale.Simulation {
	if !anyPending(pods) {
		return nil
	}
	sim, err := SimulationOf(PlanInputOf(pods, nodes, p.claims, s))
	if err != nil {
		r.Log.Error("nodehost_simulation_failed", "cluster", p.key.String(), "error", err.Error())
		return nil
	}
	return sim
}

// anyPending says whether a pod asks the decision for a node.
func anyPending(pods []*corev1.Pod) bool {
	for _, p := range pods {
		if p == nil {
			continue
		}
		if sp := PodOf(p); sp.Unschedulable && !sp.Daemon && !sp.Finished {
			return true
		}
	}
	return false
}
