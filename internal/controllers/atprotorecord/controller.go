package atprotorecord

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// ControllerName names the AtprotoRecord controller in logs and metrics.
const ControllerName = "atprotorecord"

// Field indexes the controller registers on AtprotoRecords.
const (
	indexPath    = "spec.collectionRKey" // collection/rkey
	indexRepoRef = "spec.repoRef"        // namespace/name of the AtprotoRepo
)

// ResyncPeriod is how often a record in sync is read back when nothing else triggers it.
const ResyncPeriod = 10 * time.Minute

// unavailableRetry is the wait after a repo that could not be reached gave no hint.
const unavailableRetry = 5 * time.Second

// Reconciler reconciles AtprotoRecord objects.
type Reconciler struct {
	Client   client.Client
	Resolver *repos.Resolver
	Log      *slog.Logger
	Now      func() time.Time
}

// Setup registers the AtprotoRecord controller with m. broker, when not nil, triggers a
// reconcile of the records at each changed path.
func Setup(m ctrl.Manager, res *repos.Resolver, broker *watch.Broker, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	r := &Reconciler{Client: m.GetClient(), Resolver: res, Log: log.With("controller", ControllerName), Now: time.Now}
	idx := m.GetFieldIndexer()
	ctx := context.Background()
	if err := idx.IndexField(ctx, &v1alpha1.AtprotoRecord{}, indexPath, func(o client.Object) []string {
		rec := o.(*v1alpha1.AtprotoRecord)
		return []string{rec.Spec.Collection + "/" + rec.Spec.RKey}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &v1alpha1.AtprotoRecord{}, indexRepoRef, func(o client.Object) []string {
		rec := o.(*v1alpha1.AtprotoRecord)
		return []string{refKey(rec.Namespace, rec.Spec.RepoRef).String()}
	}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		// Only spec changes (and deletion, which bumps the generation) need a reconcile:
		// the controller's own finalizer and status writes do not, and skipping them halves
		// the API server load of a burst of records.
		For(&v1alpha1.AtprotoRecord{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.AtprotoRepo{}, handler.EnqueueRequestsFromMapFunc(r.recordsOfRepo)).
		WithOptions(manager.ControllerOptions(64))
	if broker != nil {
		b = b.WatchesRawSource(broker.Source(handler.TypedEnqueueRequestsFromMapFunc(r.recordsOfChange)))
	}
	return b.Complete(manager.Observed(ControllerName, r, obs))
}

func refKey(ns string, ref v1alpha1.ObjectRef) types.NamespacedName {
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	return types.NamespacedName{Namespace: ns, Name: ref.Name}
}

func requests(list []v1alpha1.AtprotoRecord) []reconcile.Request {
	out := make([]reconcile.Request, 0, len(list))
	for _, rec := range list {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}})
	}
	return out
}

// recordsOfRepo maps an AtprotoRepo to the records written through it, so that records
// waiting for their repo go on as soon as it is Ready.
func (r *Reconciler) recordsOfRepo(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.AtprotoRecordList
	key := types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}.String()
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexRepoRef: key}); err != nil {
		return nil
	}
	return requests(list.Items)
}

// recordsOfChange maps a record change seen by a watch to the AtprotoRecords of that path.
// Records of other repos at the same path are reconciled too, which costs one read each.
func (r *Reconciler) recordsOfChange(ctx context.Context, c watch.Change) []reconcile.Request {
	var list v1alpha1.AtprotoRecordList
	if err := r.Client.List(ctx, &list, client.MatchingFields{indexPath: c.Collection + "/" + c.RKey}); err != nil {
		return nil
	}
	return requests(list.Items)
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): patches its records (the
// finalizer) and their status, reads repos and the credentials Secrets a remote repo logs
// in with.
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecords,verbs=list;watch;patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecords/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Reconcile keeps one record written, or finalizes it.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.AtprotoRecord
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if obj.DeletionTimestamp != nil {
		return r.finalize(ctx, &obj)
	}
	// The finalizer goes on before the first write: a record written by an object deleted
	// in between would otherwise be left behind.
	if _, err := reconcilekit.EnsureFinalizer(ctx, r.Client, &obj, v1alpha1.FinalizerAtprotoRecord); err != nil {
		return reconcilekit.Settle(ctx, fmt.Errorf("adding finalizer to %s: %w", req, err))
	}
	stored := obj.DeepCopy()
	res, syncErr := r.sync(ctx, &obj)
	obj.Status.ObservedGeneration = obj.Generation
	written, err := reconcilekit.CommitStatus(ctx, r.Client, stored, &obj)
	if err != nil {
		return written, fmt.Errorf("writing status of %s: %w", req, err)
	}
	if written.RequeueAfter > 0 {
		return written, nil
	}
	return res, syncErr
}

// setInSync sets the InSync condition.
func setInSync(obj *v1alpha1.AtprotoRecord, ok bool, reason v1alpha1.ConditionReason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{
		Type: string(v1alpha1.ConditionInSync), Status: st, Reason: string(reason), Message: msg, ObservedGeneration: obj.Generation,
	})
}

// unavailable reports a repo that cannot be reached and says when to look again.
func unavailable(obj *v1alpha1.AtprotoRecord, err error) reconcile.Result {
	setInSync(obj, false, v1alpha1.ReasonRepoUnavailable, err.Error())
	retry := repos.RetryAfter(err)
	if retry == 0 {
		retry = unavailableRetry
	}
	return reconcile.Result{RequeueAfter: retry}
}

// isUnavailable reports whether err is about reaching the repo rather than the record.
func isUnavailable(err error) bool {
	return errors.Is(err, repos.ErrUnavailable) || errors.Is(err, repos.ErrLoginFailed)
}
