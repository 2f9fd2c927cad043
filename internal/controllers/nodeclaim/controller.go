package nodeclaim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/tenant"
)

// ControllerName names the NodeClaim controller in logs and metrics.
const ControllerName = "nodeclaim"

// FieldManager is the field manager of every write of a cluster Infra's spec.
const FieldManager = "socialweb.computer/nodeclaim"

// DefaultContractNamespace is the gateway's contract workspace: where cluster Infras, their
// ComputeContracts and the join bundles live (docs/ARCHITECTURE.md section 2: the gateway's
// workspace is the namespace gateway).
const DefaultContractNamespace = "gateway"

// Errors a reconcile can end with.
var (
	// ErrInfraDeleting: the cluster's Infra is being deleted (its Cluster went, or its last
	// entry was dropped); a new entry waits until it is gone.
	ErrInfraDeleting = errors.New("the cluster's Infra is being deleted")
	// ErrNoBundler: this process cannot mint join bundles (it runs no tenant control planes).
	ErrNoBundler = errors.New("this controller process runs no tenant control planes and cannot mint join bundles")
)

// Bundler mints the join bundle of a node (tenant.Manager is one).
type Bundler interface {
	MintNodeBundle(k tenant.Key, nodeName string) (tenant.NodeBundle, error)
}

// Nodes reads, removes and revokes a tenant cluster's nodes (tenant.Manager is one). Nil: no
// claim reaches Running, and a released node's object and credentials stay in its cluster
// (a process that runs no tenant control planes cannot reach their state).
type Nodes interface {
	// NodeReady reports whether the node is registered and Ready.
	NodeReady(ctx context.Context, k tenant.Key, nodeName string) (bool, error)
	// DeleteNode deletes the node's object (absent is no error).
	DeleteNode(ctx context.Context, k tenant.Key, nodeName string) error
	// RevokeNode makes every credential of the node stop working in the cluster (its join
	// bundle, its renewed certificates, its tunnels), durably; again is no error.
	RevokeNode(k tenant.Key, nodeName string) error
}

// Reconciler reconciles NodeClaims.
type Reconciler struct {
	Client client.Client
	// Reader reads the Infra for a read-modify-write straight from the API server; nil
	// means Client.
	Reader client.Reader
	// Bundler mints join bundles; nil leaves every entry Staged (ErrNoBundler).
	Bundler Bundler
	// Nodes tells Running from Joining; nil never reports Running.
	Nodes Nodes
	// ContractNamespace is where cluster Infras live; empty means DefaultContractNamespace.
	ContractNamespace string
	// BidWindow is the bid window of the node contracts (policyArgs bidWindowSec); 0 leaves
	// the market's default (market.DefaultBidWindow).
	BidWindow time.Duration
	// Graces bound the wait for a node to join and a joined node's NotReady; zero means
	// infra.DefaultNodeGraces.
	Graces infra.NodeGraces
	Log    *slog.Logger

	locks locks
	index index
}

// Options configure Setup.
type Options struct {
	Bundler           Bundler
	Nodes             Nodes
	ContractNamespace string
	// BidWindow: Reconciler.BidWindow.
	BidWindow time.Duration
	// Graces: Reconciler.Graces.
	Graces   infra.NodeGraces
	Log      *slog.Logger
	Observer manager.ReconcileObserver
}

// Setup registers the NodeClaim controller and its start-up resync with m.
func Setup(m crmanager.Manager, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.Default()
	}
	r := &Reconciler{Client: m.GetClient(), Reader: m.GetAPIReader(), Bundler: o.Bundler, Nodes: o.Nodes,
		ContractNamespace: o.ContractNamespace, BidWindow: o.BidWindow, Graces: o.Graces, Log: log.With("controller", ControllerName)}
	if err := ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.NodeClaim{}).
		Watches(&v1alpha1.ComputeContract{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfContract)).
		Watches(&v1alpha1.Infra{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfInfra)).
		Watches(&v1alpha1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.claimsOfCluster)).
		WithOptions(manager.ControllerOptions(4)).
		Complete(manager.Observed(ControllerName, r, o.Observer)); err != nil {
		return err
	}
	return m.Add(crmanager.RunnableFunc(func(ctx context.Context) error {
		if err := r.Resync(ctx); err != nil {
			r.log().Error("nodeclaim_resync_failed", "error", err)
		}
		return nil
	}))
}

func (r *Reconciler) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

func (r *Reconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

func (r *Reconciler) contractNamespace() string {
	if r.ContractNamespace != "" {
		return r.ContractNamespace
	}
	return DefaultContractNamespace
}

// pass is what one reconcile of a claim carries from step to step.
type pass struct {
	claim  *v1alpha1.NodeClaim
	stored *v1alpha1.NodeClaim
	// cluster is the claim's Cluster; nil when gone.
	cluster *v1alpha1.Cluster
	// home is the Cluster's namespace (workspace).
	home string
	// infraKey, entry and contract name the claim's Infra, its entry and the entry's
	// ComputeContract.
	infraKey types.NamespacedName
	entry    string
	contract string
	// infra is the Infra as last read or written; nil when there is none.
	infra *v1alpha1.Infra
	// state is the entry's desired state as composed ("" when the claim has no entry).
	state v1alpha1.ContractState
	// bundle is the join bundle Secret once written.
	bundle *v1alpha1.SecretKeyRef
	server string
	// message explains a wait.
	message string
	// requeueAfter asks to look again (a node joining, an Infra being deleted).
	requeueAfter time.Duration
}

func (p *pass) clusterInfra() infra.ClusterInfra {
	return infra.ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: p.home, Name: p.claim.Spec.ClusterRef.Name}}
}

func (p *pass) clusterKey() tenant.Key {
	return tenant.Key{Namespace: p.home, Name: p.claim.Spec.ClusterRef.Name}
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): patches claims (the release
// finalizer) and their status; creates, updates and deletes the node Infra entries; creates
// and deletes node bundle Secrets and keeps the account's node-time ledger Secret
// (quota/ledger); creates the owner's AtprotoRepo of a Cluster that publishes its nodes'
// Infra; reads Clusters and ComputeContracts.
// +kubebuilder:rbac:groups=socialweb.computer,resources=nodeclaims,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=nodeclaims/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=infras,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch;create
// +kubebuilder:rbac:groups=socialweb.computer,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=socialweb.computer,resources=computecontracts,verbs=list;watch

// Reconcile runs the steps of one claim: finalize (when deleted), the finalizer (before any
// side effect), the cluster (a deleted Cluster deletes the Infra), the bundle, the entry,
// the status once, and the node's revocation once the claim ended.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var claim v1alpha1.NodeClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	p := r.newPass(&claim)
	r.index.learn(p)

	if !claim.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, p)
	}
	added, err := reconcilekit.EnsureFinalizer(ctx, r.Client, &claim, v1alpha1.FinalizerNodeClaimRelease)
	if err != nil {
		return reconcilekit.Settle(ctx, client.IgnoreNotFound(fmt.Errorf("adding finalizer to %s: %w", req, err)))
	}
	if added {
		p.stored = claim.DeepCopy()
	}

	if err := r.readCluster(ctx, p); err != nil {
		return done(ctx, err)
	}
	if p.cluster == nil || !p.cluster.DeletionTimestamp.IsZero() {
		if err := r.clusterGone(ctx, p); err != nil {
			return done(ctx, err)
		}
	} else {
		if err := r.ensureBundle(ctx, p); err != nil {
			return done(ctx, err)
		}
		if err := r.declare(ctx, p); err != nil {
			return done(ctx, err)
		}
	}
	if err := r.writeStatus(ctx, p); err != nil {
		return done(ctx, err)
	}
	// A claim that ended (Lost, Failed) has no node any more, but whoever copied the node's
	// bundle or certificates (a tenant inside the guest) still holds them: they stop now, not
	// when the node host deletes the claim.
	if infra.NodeClaimEnded(p.claim.Status.Phase) {
		if err := r.revokeNode(p); err != nil {
			return done(ctx, err)
		}
	}
	return reconcile.Result{RequeueAfter: p.requeueAfter}, nil
}

func (r *Reconciler) newPass(claim *v1alpha1.NodeClaim) *pass {
	home := claim.Spec.ClusterRef.Namespace
	if home == "" {
		home = claim.Namespace
	}
	name := infra.ClusterInfraName(home, claim.Spec.ClusterRef.Name)
	entry := infra.NodeEntryName(string(claim.UID))
	return &pass{claim: claim, stored: claim.DeepCopy(), home: home,
		infraKey: types.NamespacedName{Namespace: r.contractNamespace(), Name: name},
		entry:    entry, contract: infra.ContractName(infra.KindInfra, name, entry)}
}

// readCluster reads the claim's Cluster; gone leaves p.cluster nil.
func (r *Reconciler) readCluster(ctx context.Context, p *pass) error {
	var c v1alpha1.Cluster
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: p.home, Name: p.claim.Spec.ClusterRef.Name}, &c)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading Cluster %s/%s: %w", p.home, p.claim.Spec.ClusterRef.Name, err)
	}
	p.cluster = &c
	return nil
}

// done turns a step's error into the result: a conflict is an ordinary retry
// (reconcilekit.Settle), an Infra being deleted is looked at again shortly (its deletion
// wakes only the claims it names).
func done(ctx context.Context, err error) (reconcile.Result, error) {
	if errors.Is(err, ErrInfraDeleting) {
		return reconcile.Result{RequeueAfter: 500 * time.Millisecond}, nil
	}
	return reconcilekit.Settle(ctx, err)
}
