package infra

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/watch"
)

// Field indexes on Infra and EphemeralInfra.
const (
	// IndexRecordURI is the at-uri of the record an object binds: spec.record.uri, else the
	// status.record.uri a publishing object holds.
	IndexRecordURI = "record.uri"
	// IndexRepoRef is namespace/name of the AtprotoRepo in spec.record.repoRef.
	IndexRepoRef = "spec.record.repoRef"
)

func setupIndexes(m ctrl.Manager) error {
	ctx := context.Background()
	idx := m.GetFieldIndexer()
	for _, kind := range []infra.Kind{infra.KindInfra, infra.KindEphemeralInfra} {
		if err := idx.IndexField(ctx, newObject(kind), IndexRecordURI, func(o client.Object) []string {
			if u := BoundURI(wrap(o)); u != "" {
				return []string{u}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := idx.IndexField(ctx, newObject(kind), IndexRepoRef, func(o client.Object) []string {
			w := wrap(o)
			if w.spec.Record == nil {
				return nil
			}
			return []string{refKey(o.GetNamespace(), w.spec.Record.RepoRef).String()}
		}); err != nil {
			return err
		}
	}
	return nil
}

// BoundURI is the record an object binds, or "".
func BoundURI(o *object) string {
	if o.spec.Record == nil {
		return ""
	}
	if o.spec.Record.URI != "" {
		return o.spec.Record.URI
	}
	if o.status.Record != nil && o.status.Record.Direction != v1alpha1.RecordRetained {
		return o.status.Record.URI
	}
	return ""
}

func refKey(ns string, ref v1alpha1.ObjectRef) types.NamespacedName {
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	return types.NamespacedName{Namespace: ns, Name: ref.Name}
}

func (r *Reconciler) list(ctx context.Context, opts ...client.ListOption) []*object {
	var out []*object
	if r.Kind == infra.KindEphemeralInfra {
		var l v1alpha1.EphemeralInfraList
		if err := r.Client.List(ctx, &l, opts...); err != nil {
			return nil
		}
		for i := range l.Items {
			out = append(out, wrap(&l.Items[i]))
		}
		return out
	}
	var l v1alpha1.InfraList
	if err := r.Client.List(ctx, &l, opts...); err != nil {
		return nil
	}
	for i := range l.Items {
		out = append(out, wrap(&l.Items[i]))
	}
	return out
}

// objectsOfChange maps a record change seen by a watch to the objects (in the watch's
// namespace) bound to that record whose stored cid differs: an echo of our own write, whose
// cid status already holds, wakes nobody.
func (r *Reconciler) objectsOfChange(ctx context.Context, c watch.Change) []reconcile.Request {
	if c.Collection != r.Kind.Collection() || c.RKey == infra.RkeySelf {
		return nil
	}
	var out []reconcile.Request
	for _, o := range r.list(ctx, client.InNamespace(c.Watch.Namespace), client.MatchingFields{IndexRecordURI: c.URI}) {
		if o.status.Record != nil && o.status.Record.CID == c.CID && c.CID != "" {
			continue
		}
		out = append(out, reconcile.Request{NamespacedName: key(o.obj)})
	}
	return out
}

// objectsOfRepo maps an AtprotoRepo to the objects bound through it: a repo that comes back
// wakes the objects whose record was unavailable.
func (r *Reconciler) objectsOfRepo(ctx context.Context, repo client.Object) []reconcile.Request {
	var out []reconcile.Request
	for _, o := range r.list(ctx, client.MatchingFields{IndexRepoRef: key(repo).String()}) {
		out = append(out, reconcile.Request{NamespacedName: key(o.obj)})
	}
	return out
}

// ensureWatch makes sure the AtprotoRecordWatch of the repo and the kind's collection exists
// in the object's namespace.
func (r *Reconciler) ensureWatch(ctx context.Context, o *object, repoRef v1alpha1.ObjectRef) error {
	return EnsureWatch(ctx, r.Client, r.Kind, o.obj.GetNamespace(), repoRef, o.spec.Record.EventSourceRefs, r.ownerRef(o, false))
}

// EnsureWatch creates the repo's AtprotoRecordWatch for kind in ns when it is missing, with
// creator as its owner reference. The watch is owned by every object bound through the repo,
// but as a reference count over the field index rather than one ownerReference each: a
// thousand objects appending themselves to one object's ownerReferences made every bind a
// write conflict on it (see docs/infra.md). The last one to leave deletes it (ReleaseWatch).
func EnsureWatch(ctx context.Context, c client.Client, kind infra.Kind, ns string, repoRef v1alpha1.ObjectRef, sources []v1alpha1.ObjectRef, creator metav1.OwnerReference) error {
	name := infra.WatchName(kind, repoRef)
	var w v1alpha1.AtprotoRecordWatch
	err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &w)
	if apierrors.IsNotFound(err) {
		w = v1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:          map[string]string{v1alpha1.LabelInfraKind: string(kind)},
			OwnerReferences: []metav1.OwnerReference{creator}},
			Spec: v1alpha1.AtprotoRecordWatchSpec{RepoRef: repoRef, Collection: kind.Collection(),
				Source: v1alpha1.WatchSource{EventSourceRefs: sources}}}
		if err := c.Create(ctx, &w); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating AtprotoRecordWatch %s: %w", name, err)
		}
		return nil
	}
	return err
}

// releaseWatch deletes the repo's watch when no other object of the namespace is bound
// through the repo and no collection enumerates it: the embedded core runs no garbage
// collector, so the owners clean up after themselves.
func (r *Reconciler) releaseWatch(ctx context.Context, o *object, repoRef v1alpha1.ObjectRef) error {
	ns := o.obj.GetNamespace()
	for _, other := range r.list(ctx, client.MatchingFields{IndexRepoRef: refKey(ns, repoRef).String()}) {
		if other.obj.GetUID() != o.obj.GetUID() && other.obj.GetNamespace() == ns && other.obj.GetDeletionTimestamp() == nil {
			return nil
		}
	}
	if n, err := collectionsOf(ctx, r.Client, r.Kind, ns, refKey(ns, repoRef)); err != nil || n > 0 {
		return err
	}
	var w v1alpha1.AtprotoRecordWatch
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: infra.WatchName(r.Kind, repoRef)}, &w); err != nil {
		return client.IgnoreNotFound(err)
	}
	return client.IgnoreNotFound(r.Client.Delete(ctx, &w))
}

// collectionsOf counts the collections of kind in ns that enumerate the repo.
func collectionsOf(ctx context.Context, c client.Client, kind infra.Kind, ns string, repo types.NamespacedName) (int, error) {
	var specs []v1alpha1.InfraCollectionSpec
	if kind == infra.KindEphemeralInfra {
		var l v1alpha1.EphemeralInfraCollectionList
		if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		for _, x := range l.Items {
			specs = append(specs, x.Spec)
		}
	} else {
		var l v1alpha1.InfraCollectionList
		if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return 0, err
		}
		for _, x := range l.Items {
			specs = append(specs, x.Spec)
		}
	}
	n := 0
	for _, s := range specs {
		if refKey(ns, s.RepoRef) == repo {
			n++
		}
	}
	return n, nil
}
