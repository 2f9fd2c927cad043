package infracollection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	infractl "socialweb.computer/internal/controllers/infra"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// Controller names, in logs and metrics.
const (
	ControllerName          = "infracollection"
	EphemeralControllerName = "ephemeralinfracollection"
)

// Ready reasons of a collection.
const (
	ReasonListed          = "Listed"
	ReasonRepoUnavailable = string(v1alpha1.ReasonRepoUnavailable)
)

// listPage is the listRecords page size.
const listPage = 100

// Reconciler reconciles one kind of collection.
type Reconciler struct {
	Kind     infra.Kind
	Client   client.Client
	Resolver *repos.Resolver
	Log      *slog.Logger
	Now      func() time.Time
}

// Setup registers the InfraCollection and EphemeralInfraCollection controllers with m.
func Setup(m ctrl.Manager, res *repos.Resolver, broker *watch.Broker, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	for _, kind := range []infra.Kind{infra.KindInfra, infra.KindEphemeralInfra} {
		name := ControllerName
		var coll, child client.Object = &v1alpha1.InfraCollection{}, &v1alpha1.Infra{}
		if kind == infra.KindEphemeralInfra {
			name, coll, child = EphemeralControllerName, &v1alpha1.EphemeralInfraCollection{}, &v1alpha1.EphemeralInfra{}
		}
		r := &Reconciler{Kind: kind, Client: m.GetClient(), Resolver: res, Log: log.With("controller", name), Now: time.Now}
		b := ctrl.NewControllerManagedBy(m).
			Named(name).
			For(coll).
			Owns(child).
			WithOptions(manager.ControllerOptions(2))
		if broker != nil {
			b = b.WatchesRawSource(broker.Source(handler.TypedEnqueueRequestsFromMapFunc(r.collectionsOfChange)))
		}
		if err := b.Complete(manager.Observed(name, r, obs)); err != nil {
			return err
		}
	}
	return nil
}

// collection is the adapter over both collection kinds.
type collection struct {
	obj    client.Object
	spec   *v1alpha1.InfraCollectionSpec
	status *v1alpha1.InfraCollectionStatus
}

func (r *Reconciler) newCollection() *collection {
	if r.Kind == infra.KindEphemeralInfra {
		o := &v1alpha1.EphemeralInfraCollection{}
		return &collection{obj: o, spec: &o.Spec, status: &o.Status}
	}
	o := &v1alpha1.InfraCollection{}
	return &collection{obj: o, spec: &o.Spec, status: &o.Status}
}

func (r *Reconciler) collectionKind() string {
	if r.Kind == infra.KindEphemeralInfra {
		return "EphemeralInfraCollection"
	}
	return "InfraCollection"
}

// collectionsOfChange wakes the collections of the watch's namespace on a change of the
// kind's records or of the index at self.
func (r *Reconciler) collectionsOfChange(ctx context.Context, c watch.Change) []reconcile.Request {
	if c.Collection != r.Kind.Collection() && !(c.Collection == atinfra.InfraNSID && c.RKey == infra.RkeySelf) {
		return nil
	}
	var names []string
	if r.Kind == infra.KindEphemeralInfra {
		var l v1alpha1.EphemeralInfraCollectionList
		if err := r.Client.List(ctx, &l, client.InNamespace(c.Watch.Namespace)); err != nil {
			return nil
		}
		for _, x := range l.Items {
			names = append(names, x.Name)
		}
	} else {
		var l v1alpha1.InfraCollectionList
		if err := r.Client.List(ctx, &l, client.InNamespace(c.Watch.Namespace)); err != nil {
			return nil
		}
		for _, x := range l.Items {
			names = append(names, x.Name)
		}
	}
	out := make([]reconcile.Request, 0, len(names))
	for _, n := range names {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Watch.Namespace, Name: n}})
	}
	return out
}

// Access, for the generated ClusterRole (config/rbac/role.yaml), for both kinds: writes the
// collection's status, creates its children and the repo's AtprotoRecordWatch, reads repos
// and Secrets.
// +kubebuilder:rbac:groups=socialweb.computer,resources=infracollections;ephemeralinfracollections,verbs=list;watch
// +kubebuilder:rbac:groups=socialweb.computer,resources=infracollections/status;ephemeralinfracollections/status,verbs=patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=infras;ephemeralinfras;atprotorecordwatches,verbs=list;watch;create
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Reconcile lists the repo's live records, plans the children and creates the missing ones,
// then writes status once.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	col := r.newCollection()
	if err := r.Client.Get(ctx, req.NamespacedName, col.obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if col.obj.GetDeletionTimestamp() != nil {
		return reconcile.Result{}, nil
	}
	stored := col.obj.DeepCopyObject().(client.Object)
	now := time.Now()
	if r.Now != nil {
		now = r.Now()
	}
	err := r.sync(ctx, col, now)
	col.status.ObservedGeneration = col.obj.GetGeneration()
	if res, perr := reconcilekit.CommitStatus(ctx, r.Client, stored, col.obj); perr != nil || res.RequeueAfter > 0 {
		return res, client.IgnoreNotFound(perr)
	}
	return reconcilekit.Settle(ctx, err)
}

func (r *Reconciler) sync(ctx context.Context, col *collection, now time.Time) error {
	ns := col.obj.GetNamespace()
	repo, err := r.Resolver.ForRef(ctx, ns, col.spec.RepoRef)
	if err != nil {
		setReady(col, false, ReasonRepoUnavailable, err.Error())
		return nil
	}
	owner := metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: r.collectionKind(), Name: col.obj.GetName(),
		UID: col.obj.GetUID(), Controller: ptr(false), BlockOwnerDeletion: ptr(false)}
	if err := infractl.EnsureWatch(ctx, r.Client, r.Kind, ns, col.spec.RepoRef, col.spec.EventSourceRefs, owner); err != nil {
		return err
	}
	records, how, err := r.listed(ctx, repo, now)
	if err != nil {
		setReady(col, false, ReasonRepoUnavailable, err.Error())
		return nil
	}
	objects, err := r.existing(ctx, ns, col.obj.GetUID())
	if err != nil {
		return err
	}
	plan := infra.PlanCollection(records, objects)
	for _, c := range plan.Create {
		if err := r.createChild(ctx, col, c); err != nil {
			return err
		}
	}
	col.status.Children = plan.Children
	setReady(col, true, ReasonListed, fmt.Sprintf("%d live records (%s)", len(records), how))
	return nil
}

// listed is the repo's live records of the kind: from the index at self while it is
// complete (each entry's record read to confirm it is there), else from listRecords, page by
// page. Ended records and ephemeral records past their deadline are not live.
func (r *Reconciler) listed(ctx context.Context, repo repos.Repo, now time.Time) ([]infra.ListedRecord, string, error) {
	idx, _, _, err := infractl.ReadIndex(ctx, repo)
	if err != nil {
		return nil, "", err
	}
	var out []infra.ListedRecord
	if infra.IndexComplete(idx) {
		for _, e := range idx.Live {
			if e.Collection != r.Kind.Collection() || e.Rkey == infra.RkeySelf {
				continue
			}
			rec, err := repo.Get(ctx, e.Collection, e.Rkey)
			if errors.Is(err, repos.ErrNotFound) {
				continue // not written yet, or gone: its child would delete itself
			}
			if err != nil {
				return nil, "", err
			}
			if live(infra.ReadRecord(r.Kind, rec.Value, rec.CID), now) {
				out = append(out, infra.ListedRecord{Rkey: e.Rkey, URI: rec.URI, CID: rec.CID})
			}
		}
		return out, "index", nil
	}
	cursor := ""
	for {
		page, next, err := repo.List(ctx, r.Kind.Collection(), cursor, listPage)
		if err != nil {
			return nil, "", err
		}
		for _, rec := range page {
			u, err := infra.ParseATURI(rec.URI)
			if err != nil || u.Rkey.String() == infra.RkeySelf {
				continue
			}
			if live(infra.ReadRecord(r.Kind, rec.Value, rec.CID), now) {
				out = append(out, infra.ListedRecord{Rkey: u.Rkey.String(), URI: rec.URI, CID: rec.CID})
			}
		}
		if next == "" || len(page) == 0 {
			return out, "listRecords", nil
		}
		cursor = next
	}
}

func live(read infra.RecordRead, now time.Time) bool {
	return read.Found && !read.Ended && (read.ExpiresAt == nil || now.Before(*read.ExpiresAt))
}

// existing lists the workspace's objects of the kind with the record each binds.
func (r *Reconciler) existing(ctx context.Context, ns string, uid types.UID) ([]infra.ExistingObject, error) {
	var out []infra.ExistingObject
	add := func(o client.Object, spec v1alpha1.InfraSpec, st v1alpha1.InfraStatus) {
		e := infra.ExistingObject{Name: o.GetName()}
		switch {
		case spec.Record != nil && spec.Record.URI != "":
			e.BoundURI = spec.Record.URI
		case spec.Record != nil && st.Record != nil && st.Record.Direction != v1alpha1.RecordRetained:
			e.BoundURI = st.Record.URI
		}
		if ref := metav1.GetControllerOf(o); ref != nil && ref.UID == uid {
			e.OwnedByThisCollection = true
		}
		out = append(out, e)
	}
	if r.Kind == infra.KindEphemeralInfra {
		var l v1alpha1.EphemeralInfraList
		if err := r.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		for i := range l.Items {
			add(&l.Items[i], l.Items[i].Spec.InfraSpec, l.Items[i].Status.InfraStatus)
		}
		return out, nil
	}
	var l v1alpha1.InfraList
	if err := r.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range l.Items {
		add(&l.Items[i], l.Items[i].Spec, l.Items[i].Status)
	}
	return out, nil
}

// createChild creates one child: named per ChildName, owned by the collection, labelled with
// it, and with nothing but spec.record (following the record); its first sync pulls.
func (r *Reconciler) createChild(ctx context.Context, col *collection, c infra.ChildToCreate) error {
	om := metav1.ObjectMeta{Name: c.Name, Namespace: col.obj.GetNamespace(),
		Labels: map[string]string{v1alpha1.LabelInfraCollection: infra.LabelValue(col.obj.GetName())},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: r.collectionKind(),
			Name: col.obj.GetName(), UID: col.obj.GetUID(), Controller: ptr(true), BlockOwnerDeletion: ptr(false)}}}
	spec := infra.ChildSpec(col.spec.RepoRef, c.URI, col.spec.EventSourceRefs)
	var obj client.Object = &v1alpha1.Infra{ObjectMeta: om, Spec: spec}
	if r.Kind == infra.KindEphemeralInfra {
		obj = &v1alpha1.EphemeralInfra{ObjectMeta: om, Spec: v1alpha1.EphemeralInfraSpec{InfraSpec: spec}}
	}
	if err := r.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating child %s: %w", c.Name, err)
	}
	r.Log.Info("infracollection_child_created", "collection", col.obj.GetName(), "child", c.Name, "uri", c.URI)
	return nil
}

func setReady(col *collection, ok bool, reason, msg string) {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&col.status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: s,
		Reason: reason, Message: msg, ObservedGeneration: col.obj.GetGeneration()})
}

func ptr[T any](v T) *T { return &v }
