package computecontract

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "computecontract"

// Event types kept in status.events for the requester's own records.
const (
	evRFP    = "rfp"
	evAccept = "accept"
	evDelete = "delete"
)

// Reconciler reconciles ComputeContracts.
type Reconciler struct {
	Client   client.Client
	Resolver *repos.Resolver
	Index    *Index
	Log      *slog.Logger
	Now      func() time.Time

	local *pds.Server // the embedded PDS, whose firehose and records are read in-process
	mu    sync.Mutex
	// rfps are our rfps' createdAt and asked size (uri ->), read once per process.
	rfps map[string]rfpRead
	// watchingSince is when this requester began: at setup, then at the start of the
	// manager's runnables (with leader election, the leadership).
	watchingSince time.Time
	ctx           context.Context // the manager's: the index's followers live as long as it
}

// Setup registers the controller. A contract's requester follows the firehose of its repo's
// PDS (in-process for local, the embedded PDS) and every firehose of sources (PDS or relay
// URLs) besides, from the start: bidders are the offerings seen on any of them. A record a
// source does not serve itself (a relay's) is read from its DID's PDS, resolved through dir
// (nil: not at all). With store, the index is kept there and a restart starts from it (see
// Index); nil follows every source from 0 at each start.
func Setup(m ctrl.Manager, res *repos.Resolver, local *pds.Server, sources []string, dir identity.Directory, store IndexStore, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	log = log.With("controller", ControllerName)
	wake := make(chan event.GenericEvent, 1024)
	r := &Reconciler{Client: m.GetClient(), Resolver: res, Log: log, Now: time.Now, local: local}
	r.watchingSince = r.Now()
	r.Index = &Index{Log: log, restoring: store != nil, Wake: func(k types.NamespacedName) {
		o := &v1alpha1.ComputeContract{}
		o.Namespace, o.Name = k.Namespace, k.Name
		wake <- event.GenericEvent{Object: o}
	}}
	// The index's followers live as long as the manager.
	if err := m.Add(runnableFunc(func(ctx context.Context) error {
		r.mu.Lock()
		r.ctx = ctx
		r.watchingSince = r.Now()
		r.mu.Unlock()
		// Keep's last save, at the stop, ends before this runnable does.
		kept := make(chan struct{})
		if store != nil {
			snap, err := store.Load(ctx)
			if err != nil {
				log.Warn("the kept market index is not used; every source is followed from its start", "err", err)
			}
			r.Index.Restore(snap, time.Now())
			go func() { defer close(kept); r.Index.Keep(ctx, store) }()
		} else {
			close(kept)
		}
		for _, src := range feed.Sources(sources, local, dir) {
			r.Index.Follow(ctx, src)
		}
		<-ctx.Done()
		<-kept
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.ComputeContract{}).
		WatchesRawSource(source.Channel(wake, &handler.EnqueueRequestForObject{})).
		WithOptions(manager.ControllerOptions(16)).
		Complete(manager.Observed(ControllerName, r, obs))
}

type runnableFunc func(context.Context) error

func (f runnableFunc) Start(ctx context.Context) error { return f(ctx) }

// since is when this requester began watching the market (market.State.WatchingSince).
func (r *Reconciler) since() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.watchingSince
}

func (r *Reconciler) runCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx != nil {
		return r.ctx
	}
	return context.Background()
}

// round is one reconcile of one contract: the object as read (orig) and as the steps change
// it, what was read for the market, and the decision the steps apply.
type round struct {
	key      types.NamespacedName
	obj      *v1alpha1.ComputeContract
	orig     *v1alpha1.ComputeContract
	now      time.Time
	deleting bool
	repo     repos.Repo
	// policyNSID is spec.policy's record collection; required spec.requireIsolation.
	policyNSID string
	required   market.Boundary
	// priceCap is policyArgs' maxCost.
	priceCap market.PriceCap
	s        market.State
	d        market.Decision
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): patches its contracts (the
// release finalizer) and their status, reads repos, reads Secrets (a remote repo's
// credentials, the contract's spec.secretsRef) and keeps one (the index, SecretStore).
// +kubebuilder:rbac:groups=socialweb.computer,resources=computecontracts,verbs=list;watch;patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=computecontracts/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch;create;update

// Reconcile moves one contract on: read, then the step of the contract's market.StateOf
// applying what market.Next decided, then finish. The package doc lists the steps in order.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.ComputeContract
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.Index.Forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	rd, res, err := r.read(ctx, req.NamespacedName, &obj)
	if rd == nil {
		return res, err
	}
	rd.d = market.Next(rd.s)
	var step reconcile.Result
	stage := market.StateOf(rd.s)
	switch stage {
	case market.StageUnpublished:
		step, err = r.publish(ctx, rd)
	case market.StageBidding:
		step, err = r.accept(ctx, rd)
	case market.StageBound:
		step, err = r.guest(ctx, rd)
	case market.StageReleasing:
		step, err = r.release(ctx, rd)
	case market.StageAccepted, market.StageFinal:
		// Nothing to write: the receipt is awaited (Next's deadline requeue), or the
		// contract ended (read stops before a final one).
	}
	if err != nil {
		d, retry := stepFailure(stage, rd.orig.Status.Phase, err)
		if d == nil {
			return step, err
		}
		rd.d = *d
		if res, werr := r.finish(ctx, rd); werr != nil || !retry {
			return res, werr
		}
		return step, err
	}
	res, err = r.finish(ctx, rd)
	return reconcilekit.Merge(step, res), err
}

// fetcherFor reads the records of the PDS at endpoint: in-process when it is the embedded
// one, over XRPC without a session otherwise.
func (r *Reconciler) fetcherFor(endpoint string) feed.Fetcher {
	return feed.SourceOf(endpoint, r.local, nil).Fetch
}

func (r *Reconciler) addEvent(st *v1alpha1.ComputeContractStatus, typ, uri string, now time.Time) {
	t := metav1.NewTime(now)
	st.Events = append(st.Events, v1alpha1.ContractEvent{Type: typ, URI: uri, At: &t})
}

// Record keys of a contract's records, derived from the object so a write repeated after a
// stale read or a crash finds the record written before (feed.DerivedTID).
const (
	keyPayload = iota
	keyPolicy
	keyRFP
	keyAccept
	keyDelete
	// keyRFPAgain is the rfp written again (market.ActRFPAgain).
	keyRFPAgain
)

// keyOf is the record key n of obj's records.
func keyOf(obj *v1alpha1.ComputeContract, n int) string {
	return feed.DerivedTID(string(obj.UID), obj.CreationTimestamp.Time, n)
}

// isKey reports whether uri is the record of obj's that key n names.
func isKey(obj *v1alpha1.ComputeContract, uri string, n int) bool {
	u, err := infra.ParseATURI(uri)
	return err == nil && u.Rkey.String() == keyOf(obj, n)
}

func put(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract, n int, coll string, v any) (*repos.Record, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return feed.PutOnce(ctx, repo, coll, keyOf(obj, n), raw)
}

func fetchOwn(ctx context.Context, repo repos.Repo, uri string) (*repos.Record, error) {
	u, err := infra.ParseATURI(uri)
	if err != nil {
		return nil, err
	}
	return repo.Get(ctx, u.Collection.String(), u.Rkey.String())
}
