package infra

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// Controller names, in logs and metrics.
const (
	ControllerName          = "infra"
	EphemeralControllerName = "ephemeralinfra"
)

// Field managers of the server-side apply that pulls a record's declaration into the spec.
const (
	FieldManagerInfra     = "socialweb.computer/infra-record"
	FieldManagerEphemeral = "socialweb.computer/ephemeralinfra-record"
)

// Writer is the index writer label of entries this controller adds.
const Writer = "core"

// Reconciler reconciles one kind of deployment, Infra or EphemeralInfra, through the object
// adapter below: both kinds run the same steps.
type Reconciler struct {
	Kind     infra.Kind
	Client   client.Client
	Resolver *repos.Resolver
	Log      *slog.Logger
	// Now is the clock; tests drive an EphemeralInfra's deadline through it.
	Now func() time.Time
	// Index coalesces the writes to each account's index at self; both kinds share one.
	Index *IndexWriter
}

// Setup registers the Infra and EphemeralInfra controllers with m. broker, when not nil,
// wakes the objects bound to a record that changed in a repo.
func Setup(m ctrl.Manager, res *repos.Resolver, broker *watch.Broker, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	if err := setupIndexes(m); err != nil {
		return err
	}
	index := NewIndexWriter()
	for _, kind := range []infra.Kind{infra.KindInfra, infra.KindEphemeralInfra} {
		name := ControllerName
		if kind == infra.KindEphemeralInfra {
			name = EphemeralControllerName
		}
		r := &Reconciler{Kind: kind, Client: m.GetClient(), Resolver: res, Log: log.With("controller", name), Now: time.Now, Index: index}
		b := ctrl.NewControllerManagedBy(m).
			Named(name).
			// Only spec changes and deletion (which bumps the generation) need a pass: the
			// controller's own finalizer and status writes do not.
			For(newObject(kind), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
			// A ComputeContract's phase wakes its owner (the finalizer waits on it; no polling).
			Watches(&v1alpha1.ComputeContract{}, handler.EnqueueRequestForOwner(m.GetScheme(), m.GetRESTMapper(), newObject(kind), handler.OnlyControllerOwner())).
			// The record child reports each write and each refused swap.
			Watches(&v1alpha1.AtprotoRecord{}, handler.EnqueueRequestForOwner(m.GetScheme(), m.GetRESTMapper(), newObject(kind), handler.OnlyControllerOwner())).
			// A repo that comes back (or goes away) wakes the objects bound through it.
			Watches(&v1alpha1.AtprotoRepo{}, handler.EnqueueRequestsFromMapFunc(r.objectsOfRepo)).
			WithOptions(manager.ControllerOptions(8))
		if broker != nil {
			b = b.WatchesRawSource(broker.Source(handler.TypedEnqueueRequestsFromMapFunc(r.objectsOfChange)))
		}
		if err := b.Complete(manager.Observed(name, r, obs)); err != nil {
			return err
		}
	}
	return nil
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) log() *slog.Logger {
	if r.Log != nil {
		return r.Log
	}
	return slog.Default()
}

func (r *Reconciler) gvk() schema.GroupVersionKind {
	return v1alpha1.GroupVersion.WithKind(string(r.Kind))
}

// pass is the state one reconcile carries from step to step.
type pass struct {
	obj    *object
	stored *object
	now    time.Time
	// deleteSelf is set by a step that decided the object goes (record gone, ephemeral end).
	deleteSelf bool
	// requeueAfter is the ephemeral deadline, the one timer.
	requeueAfter time.Duration
	// pulled is true once the spec was applied from the record: the object's generation moved.
	pulled bool
	// childCreated is true when this pass created the record child: the child's first
	// status write (after it wrote the record) wakes the next pass.
	childCreated bool
	// stalled are the contracts whose ComputeContract says why it cannot move on: the Ready
	// condition names them.
	stalled []infra.StalledContract
}

// Access, for the generated ClusterRole (config/rbac/role.yaml), for both kinds: patches the
// deployment (finalizer, the pulled spec by server-side apply) and deletes it (an ended
// EphemeralInfra, a record deleted upstream), writes its status; creates, releases and
// deletes its ComputeContracts; creates, updates and deletes its AtprotoRecord child; creates
// and deletes the repo's AtprotoRecordWatch; reads repos, Secrets and the collections that
// keep a watch alive.
// +kubebuilder:rbac:groups=socialweb.computer,resources=infras;ephemeralinfras,verbs=list;watch;patch;delete
// +kubebuilder:rbac:groups=socialweb.computer,resources=infras/status;ephemeralinfras/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=computecontracts,verbs=list;watch;create;patch;delete
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecords,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorecordwatches,verbs=list;watch;create;delete
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos;infracollections;ephemeralinfracollections,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Reconcile runs the steps of one deployment in order: finalize (when deleted), the release
// finalizer (before any side effect), the ephemeral end, the contracts, the record, and the
// status once.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	o := newObject(r.Kind)
	if err := r.Client.Get(ctx, req.NamespacedName, o); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	p := &pass{obj: wrap(o), now: r.now()}
	p.stored = wrap(o.DeepCopyObject().(client.Object))

	if o.GetDeletionTimestamp() != nil {
		res, err := r.finalize(ctx, p)
		if err != nil || !controllerutil.ContainsFinalizer(o, v1alpha1.FinalizerInfraRelease) {
			return res, err
		}
		written, serr := r.writeStatus(ctx, p)
		if serr != nil {
			return written, serr
		}
		return reconcilekit.Merge(res, written), nil
	}

	// Karpenter's order: the finalizer goes on before anything is created, or a deletion
	// in between would leak a ComputeContract or a record child. A deployment that owns
	// nothing yet (only staged contracts, no record) does without it.
	if infra.NeedsReleaseFinalizer(*p.obj.spec) {
		added, err := reconcilekit.EnsureFinalizer(ctx, r.Client, o, v1alpha1.FinalizerInfraRelease)
		if err != nil {
			return reconcilekit.Settle(ctx, client.IgnoreNotFound(fmt.Errorf("adding finalizer to %s: %w", req, err)))
		}
		if added {
			p.stored = wrap(o.DeepCopyObject().(client.Object))
		}
	}

	r.ephemeralDeadline(p)
	if err := r.contracts(ctx, p); err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	r.ephemeralEnd(p)
	if err := r.record(ctx, p); err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	// A deployment that just created its record child writes its status in the pass the
	// child's first status wakes, once the record is written: one status write fewer for
	// every new bound deployment, and its first status already says whether the record took.
	if !p.childCreated || p.deleteSelf {
		if written, err := r.writeStatus(ctx, p); err != nil || written.RequeueAfter > 0 {
			return written, err
		}
	}
	if p.deleteSelf {
		if err := r.Client.Delete(ctx, p.obj.obj); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("deleting %s: %w", req, err)
		}
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: p.requeueAfter}, nil
}

// ownerRef is the controller reference the objects a deployment owns carry.
func (r *Reconciler) ownerRef(o *object, controller bool) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: string(r.Kind), Name: o.obj.GetName(),
		UID: o.obj.GetUID(), Controller: ptr(controller), BlockOwnerDeletion: ptr(false)}
}

func ptr[T any](v T) *T { return &v }

func key(o client.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}
}

// object is the adapter that lets one reconciler handle both kinds: the embedded InfraSpec
// and InfraStatus of either, and the ephemeral parts when there are some.
type object struct {
	obj    client.Object
	spec   *v1alpha1.InfraSpec
	status *v1alpha1.InfraStatus
	eph    *v1alpha1.EphemeralInfra // nil for an Infra
}

func newObject(kind infra.Kind) client.Object {
	if kind == infra.KindEphemeralInfra {
		return &v1alpha1.EphemeralInfra{}
	}
	return &v1alpha1.Infra{}
}

func wrap(o client.Object) *object {
	switch t := o.(type) {
	case *v1alpha1.EphemeralInfra:
		return &object{obj: t, spec: &t.Spec.InfraSpec, status: &t.Status.InfraStatus, eph: t}
	case *v1alpha1.Infra:
		return &object{obj: t, spec: &t.Spec, status: &t.Status}
	}
	panic(fmt.Sprintf("infra: unexpected object %T", o))
}

// ephemeralSpec and ephemeralStatus are what RenderRecord takes: an Infra's wrapped without
// the ephemeral fields.
func (o *object) ephemeralSpec() v1alpha1.EphemeralInfraSpec {
	if o.eph != nil {
		return o.eph.Spec
	}
	return v1alpha1.EphemeralInfraSpec{InfraSpec: *o.spec}
}

func (o *object) ephemeralStatus() v1alpha1.EphemeralInfraStatus {
	if o.eph != nil {
		return o.eph.Status
	}
	return v1alpha1.EphemeralInfraStatus{InfraStatus: *o.status}
}

func (o *object) meta() metav1.ObjectMeta {
	switch t := o.obj.(type) {
	case *v1alpha1.EphemeralInfra:
		return t.ObjectMeta
	case *v1alpha1.Infra:
		return t.ObjectMeta
	}
	return metav1.ObjectMeta{}
}

// ended is true once an EphemeralInfra has ended (endedAt is set once).
func (o *object) ended() bool { return o.eph != nil && o.status.EndedAt != nil }
