package atprotorecordwatch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// ControllerName names the AtprotoRecordWatch controller in logs and metrics.
const ControllerName = "atprotorecordwatch"

// Ready reasons of a watch.
const (
	ReasonFollowing       = "Following"
	ReasonRepoUnavailable = "RepoUnavailable"
	ReasonStreamBroken    = "StreamBroken"
)

// Field managers of the applies of a watch's status, one per writer.
const (
	// FieldManager: the reconciler, which says the repo is unavailable while no follower
	// runs.
	FieldManager = "socialweb.computer/atprotorecordwatch"
	// FieldManagerFollower: the follower, whose checkpoint the status is.
	FieldManagerFollower = "socialweb.computer/atprotorecordwatch-follower"
)

// The parts of a watch's status its writers own. Both own the Ready condition (the
// reconciler only while no follower runs); the last apply holds it.
var (
	StatusOwner         = reconcilekit.StatusOwner{Manager: FieldManager, Conditions: []string{string(v1alpha1.ConditionReady)}}
	FollowerStatusOwner = reconcilekit.StatusOwner{Manager: FieldManagerFollower,
		Fields:     []string{"observedGeneration", "cursor", "records", "deleted"},
		Conditions: []string{string(v1alpha1.ConditionReady)}}
)

// unavailableRetry is the wait before looking again at a watch whose repo is unavailable.
const unavailableRetry = 5 * time.Second

// Reconciler starts, restarts and stops one follower per AtprotoRecordWatch.
type Reconciler struct {
	Client client.Client
	// Reader reads around the cache, for followers that must see their own last write.
	Reader   client.Reader
	Resolver *repos.Resolver
	Broker   *watch.Broker
	Log      *slog.Logger

	mu        sync.Mutex
	ctx       context.Context // the manager's, set when it starts
	followers map[types.NamespacedName]*follower
	wg        sync.WaitGroup
}

// Setup registers the AtprotoRecordWatch controller with m.
func Setup(m ctrl.Manager, res *repos.Resolver, broker *watch.Broker, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	r := &Reconciler{Client: m.GetClient(), Reader: m.GetAPIReader(), Resolver: res, Broker: broker, Log: log.With("controller", ControllerName),
		followers: map[types.NamespacedName]*follower{}}
	// Followers live as long as the manager; stopping it stops and waits for them, so that
	// none writes a status after the process has moved on.
	if err := m.Add(ctrlmanager.RunnableFunc(func(ctx context.Context) error {
		r.mu.Lock()
		r.ctx = ctx
		r.mu.Unlock()
		<-ctx.Done()
		r.stopAll()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		// Status writes are the followers' own; only spec changes and deletions matter here.
		For(&v1alpha1.AtprotoRecordWatch{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.AtprotoRepo{}, handler.EnqueueRequestsFromMapFunc(r.watchesOfRepo)).
		WithOptions(manager.ControllerOptions(4)).
		Complete(manager.Observed(ControllerName, r, obs))
}

// watchesOfRepo maps an AtprotoRepo to the watches that follow it.
func (r *Reconciler) watchesOfRepo(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.AtprotoRecordWatchList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, w := range list.Items {
		ns := w.Spec.RepoRef.Namespace
		if ns == "" {
			ns = w.Namespace
		}
		if ns == o.GetNamespace() && w.Spec.RepoRef.Name == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: w.Namespace, Name: w.Name}})
		}
	}
	return out
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): applies the watches'
// status (and once patches their managed fields, reconcilekit.ApplyStatus), reads repos and
// the credentials Secrets a remote repo logs in with.
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecordwatches,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecordwatches/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Reconcile makes sure one follower runs for the watch, for its current repo and collection.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.AtprotoRecordWatch
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.stop(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if obj.DeletionTimestamp != nil {
		r.stop(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	repo, err := r.Resolver.ForRef(ctx, obj.Namespace, obj.Spec.RepoRef)
	if err != nil {
		if r.running(req.NamespacedName) {
			// A follower that runs keeps going; it reports its own stream errors.
			return reconcile.Result{}, nil
		}
		stored := obj.DeepCopy()
		meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady),
			Status: metav1.ConditionFalse, Reason: ReasonRepoUnavailable, Message: err.Error(), ObservedGeneration: obj.Generation})
		_, werr := reconcilekit.ApplyStatus(ctx, r.Client, StatusOwner, stored, &obj)
		settled, werr := reconcilekit.Settle(ctx, werr)
		if werr != nil {
			return reconcile.Result{}, fmt.Errorf("writing status of %s: %w", req, werr)
		}
		retry := repos.RetryAfter(err)
		if retry == 0 {
			retry = unavailableRetry
		}
		return reconcilekit.Merge(settled, reconcile.Result{RequeueAfter: retry}), nil
	}
	key := followKey{did: repo.DID(), endpoint: repo.Endpoint(), collection: obj.Spec.Collection, generation: obj.Generation}
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.followers[req.NamespacedName]; f != nil {
		if f.key.sameTarget(key) {
			return reconcile.Result{}, nil
		}
		f.cancel()
		<-f.done
		delete(r.followers, req.NamespacedName)
	}
	if r.ctx == nil || r.ctx.Err() != nil {
		return reconcilekit.RequeueSoon(), nil
	}
	fctx, cancel := context.WithCancel(r.ctx)
	f := &follower{r: r, name: req.NamespacedName, key: key, src: repo.Events(), cancel: cancel, done: make(chan struct{})}
	r.followers[req.NamespacedName] = f
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(f.done)
		f.run(fctx)
	}()
	return reconcile.Result{}, nil
}

func (r *Reconciler) running(key types.NamespacedName) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.followers[key] != nil
}

func (r *Reconciler) stop(key types.NamespacedName) {
	r.mu.Lock()
	f := r.followers[key]
	delete(r.followers, key)
	r.mu.Unlock()
	if f != nil {
		f.cancel()
		<-f.done
	}
}

func (r *Reconciler) stopAll() {
	r.mu.Lock()
	for _, f := range r.followers {
		f.cancel()
	}
	r.followers = map[types.NamespacedName]*follower{}
	r.mu.Unlock()
	r.wg.Wait()
}
