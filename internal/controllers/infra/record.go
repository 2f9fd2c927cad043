package infra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
)

// Reasons of the Synced condition the controller sets itself (Decide sets the others).
const (
	ReasonBadBinding   = "InvalidBinding"
	ReasonRenderFailed = "RenderFailed"
)

// binding is a bound object's record as one reconcile resolved and read it.
type binding struct {
	repo      repos.Repo // nil when the repo is unavailable
	repoRef   v1alpha1.ObjectRef
	rkey      string
	uri       string
	following bool
	read      infra.RecordRead
	value     json.RawMessage // the record as read, when found
	// unavailable is the error of a repo or record that could not be read.
	unavailable error
}

// record syncs a bound object with its record: bind (repo, rkey, getRecord), Decide, apply
// what it says (pull by server-side apply, write through the AtprotoRecord child, delete
// the object), keep the repo's watch and the index at self. Removing spec.record unbinds.
func (r *Reconciler) record(ctx context.Context, p *pass) error {
	o := p.obj
	if o.spec.Record == nil {
		return r.unbind(ctx, p)
	}
	b, err := r.bind(ctx, o, p.now)
	if err != nil {
		setCondition(o, v1alpha1.ConditionSynced, false, ReasonBadBinding, err.Error(), p.now)
		return nil
	}
	if b.repo != nil {
		if err := r.ensureWatch(ctx, o, b.repoRef); err != nil {
			return err
		}
	}
	stored := o.status.Record.DeepCopy()
	d := infra.Decide(infra.SyncInput{
		Bound: true, Mode: o.spec.Record.Sync, Following: b.following, Rkey: b.rkey,
		Generation: o.obj.GetGeneration(), Spec: o.declaration(), Stored: stored,
		Unavailable: b.unavailable != nil, Record: b.read, URI: b.uri, Now: p.now,
	})
	for _, c := range d.Conditions {
		meta.SetStatusCondition(&o.status.Conditions, c)
	}
	if b.unavailable != nil {
		setCondition(o, v1alpha1.ConditionSynced, false, infra.ReasonSyncUnavailable, b.unavailable.Error(), p.now)
		// Nothing is written and nothing waits: the contracts went on above. The repo's
		// watch (or the AtprotoRepo coming back) wakes the object.
		return nil
	}
	switch d.Action {
	case infra.ActionPull, infra.ActionConflict:
		if err := r.pull(ctx, p, d.Pull); err != nil {
			return err
		}
		d.Record.SyncedGeneration = o.obj.GetGeneration()
		o.status.Record = d.Record
		if d.Action == infra.ActionConflict {
			r.log().Warn("infra_record_conflict", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", b.uri, "cid", b.read.CID)
		}
		// The pull landed: decide again on the spec it left (no I/O), so the object reports
		// in sync in this pass instead of waiting for the event of its own spec change.
		again := infra.Decide(infra.SyncInput{
			Bound: true, Mode: o.spec.Record.Sync, Following: b.following, Rkey: b.rkey,
			Generation: o.obj.GetGeneration(), Spec: o.declaration(), Stored: o.status.Record,
			Record: b.read, URI: b.uri, Now: p.now,
		})
		if again.Action == infra.ActionInSync {
			for _, c := range again.Conditions {
				meta.SetStatusCondition(&o.status.Conditions, c)
			}
			o.status.Record = again.Record
		}
	case infra.ActionDelete:
		r.log().Info("infra_record_deleted", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", b.uri)
		p.deleteSelf = true
	default:
		if d.Record != nil {
			o.status.Record = d.Record
		}
	}
	switch d.Write {
	case infra.WriteRecord:
		if d.Overwrite {
			r.log().Warn("infra_record_overwritten", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", b.uri, "cid", b.read.CID)
		}
		if err := r.writeRecord(ctx, p, b, d.SwapCID, true); err != nil {
			return err
		}
	case infra.WriteStatusIfDue:
		if err := r.writeRecord(ctx, p, b, d.SwapCID, false); err != nil {
			return err
		}
	}
	if indexDue(d.Action, stored) {
		entry := r.indexEntry(o, b)
		if err := r.indexUpdate(ctx, b.repo, p.now, func(idx *atinfra.InfraIndex) (*atinfra.InfraIndex, bool) {
			return infra.IndexPass(idx, entry, true, p.now)
		}); err != nil {
			r.log().Warn("infra_index_failed", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "err", err)
		}
	}
	return nil
}

// publishes reports whether the object is bound with sync Publish: its record is a view
// (infra.PublishedSpec), never pulled.
func (o *object) publishes() bool {
	return o.spec.Record != nil && o.spec.Record.Sync == v1alpha1.RecordSyncPublish
}

// declaration is the spec's declaration as the record is compared with: under Publish the
// projection the record shows.
func (o *object) declaration() infra.Declaration {
	if o.publishes() {
		return infra.DeclarationFromSpec(infra.PublishedSpec(*o.spec))
	}
	return infra.DeclarationFromSpec(*o.spec)
}

// bind resolves the repo, the record key (following spec.record.uri, or the successor rkey
// a publishing object holds or takes) and reads the record with getRecord.
func (r *Reconciler) bind(ctx context.Context, o *object, now time.Time) (*binding, error) {
	rb := o.spec.Record
	b := &binding{repoRef: rb.RepoRef, following: rb.URI != ""}
	if b.following {
		if u, err := infra.ParseATURI(rb.URI); err == nil {
			b.rkey, b.uri = u.Rkey.String(), rb.URI
		}
	} else if st := o.status.Record; st != nil && st.URI != "" && st.Direction != v1alpha1.RecordRetained {
		if u, err := infra.ParseATURI(st.URI); err == nil {
			b.rkey, b.uri = u.Rkey.String(), st.URI
		}
	}
	repo, err := r.Resolver.ForRef(ctx, o.obj.GetNamespace(), rb.RepoRef)
	if err != nil {
		b.unavailable = err
		return b, nil
	}
	b.repo = repo
	if b.following {
		u, err := infra.CheckFollow(rb.URI, repo.DID(), r.Kind)
		if err != nil {
			return nil, err
		}
		b.rkey = u.Rkey.String()
	} else {
		name, uid := o.obj.GetName(), string(o.obj.GetUID())
		bound := false
		if u, err := infra.CheckFollow(b.uri, repo.DID(), r.Kind); err == nil && infra.InSuccession(name, uid, u.Rkey.String()) {
			bound = true
		}
		if !bound {
			rkey, read, value, err := r.freshRkey(ctx, repo, name, uid, now)
			if err != nil {
				if errors.Is(err, errExhausted) {
					return nil, err
				}
				b.unavailable = err
				return b, nil
			}
			b.rkey, b.uri, b.read, b.value = rkey, infra.RecordURI(repo.DID(), r.Kind, rkey), read, value
			return b, nil
		}
	}
	b.uri = infra.RecordURI(repo.DID(), r.Kind, b.rkey)
	read, value, err := r.getRecord(ctx, repo, b.rkey)
	if err != nil {
		b.unavailable = err
		return b, nil
	}
	b.read, b.value = read, value
	return b, nil
}

var errExhausted = errors.New("every successor record key is taken by an ended record")

// freshRkey walks the successor rkeys (NextRkey) from the object's name, reading the record
// at each, until one may be taken.
func (r *Reconciler) freshRkey(ctx context.Context, repo repos.Repo, name, uid string, now time.Time) (string, infra.RecordRead, json.RawMessage, error) {
	cur, at := "", infra.RecordRead{}
	var value json.RawMessage
	for i := 0; i <= infra.MaxSuccessors+1; i++ {
		next, ok := infra.NextRkey(name, uid, cur, at, now)
		if !ok {
			return "", infra.RecordRead{}, nil, errExhausted
		}
		if next == cur {
			return cur, at, value, nil
		}
		cur = next
		var err error
		if at, value, err = r.getRecord(ctx, repo, cur); err != nil {
			return "", infra.RecordRead{}, nil, err
		}
	}
	return "", infra.RecordRead{}, nil, errExhausted
}

// getRecord reads the record at rkey; a missing record is a RecordRead with Found false.
func (r *Reconciler) getRecord(ctx context.Context, repo repos.Repo, rkey string) (infra.RecordRead, json.RawMessage, error) {
	rec, err := repo.Get(ctx, r.Kind.Collection(), rkey)
	switch {
	case errors.Is(err, repos.ErrNotFound):
		return infra.RecordRead{}, nil, nil
	case err != nil:
		return infra.RecordRead{}, nil, err
	}
	return infra.ReadRecord(r.Kind, rec.Value, rec.CID), rec.Value, nil
}

// pull applies the record's declaration to spec.description and spec.contracts by
// server-side apply with the record's field manager, forced: the record wins those fields.
func (r *Reconciler) pull(ctx context.Context, p *pass, d *infra.Declaration) error {
	o := p.obj
	contracts := []any{}
	if len(d.Contracts) > 0 {
		raw, err := json.Marshal(d.Contracts)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &contracts); err != nil {
			return err
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"description": d.Description, "contracts": contracts},
	}}
	u.SetGroupVersionKind(r.gvk())
	u.SetNamespace(o.obj.GetNamespace())
	u.SetName(o.obj.GetName())
	manager := FieldManagerInfra
	if r.Kind == infra.KindEphemeralInfra {
		manager = FieldManagerEphemeral
	}
	if err := r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership); err != nil {
		return fmt.Errorf("pulling the record into %s: %w", o.obj.GetName(), err)
	}
	o.obj.SetResourceVersion(u.GetResourceVersion())
	o.obj.SetGeneration(u.GetGeneration())
	o.spec.Description = d.Description
	o.spec.Contracts = d.Contracts
	p.pulled = true
	r.log().Info("infra_record_pulled", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "generation", u.GetGeneration())
	return nil
}

// writeRecord applies the AtprotoRecord child: the rendered record with swapCid, now when
// force (Create, Push), else only when StatusWriteDue says the status part is due. When it
// is not due the child is aligned with what the repo holds (the record as read, swapCid its
// cid), so the child never writes a stale record and never recreates one deleted elsewhere.
func (r *Reconciler) writeRecord(ctx context.Context, p *pass, b *binding, swapCID string, force bool) error {
	o := p.obj
	spec, status := o.ephemeralSpec(), o.ephemeralStatus()
	if o.publishes() {
		spec.InfraSpec, status = infra.PublishedSpec(spec.InfraSpec), infra.PublishedStatus(status)
	}
	rendered, err := infra.RenderRecord(r.Kind, o.meta(), spec, status, p.now)
	if err != nil {
		setCondition(o, v1alpha1.ConditionSynced, false, ReasonRenderFailed, err.Error(), p.now)
		return nil
	}
	child, err := r.getChild(ctx, o)
	if err != nil {
		return err
	}
	var value []byte
	if force {
		value, err = json.Marshal(rendered)
	} else {
		var last time.Time
		if child != nil && child.Status.LastWriteAt != nil {
			last = child.Status.LastWriteAt.Time
		}
		if infra.StatusWriteDue(b.read.Status, rendered.Status(), last, p.now) {
			value, err = json.Marshal(rendered)
		} else {
			value = b.value
		}
	}
	if err != nil {
		return err
	}
	if err := r.applyChild(ctx, o, child, b, value, swapCID); err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.InfraAfterChildApply)
	p.childCreated = child == nil
	return nil
}

func (r *Reconciler) childKey(o *object) types.NamespacedName {
	return types.NamespacedName{Namespace: o.obj.GetNamespace(), Name: infra.RecordChildName(r.Kind, o.obj.GetName())}
}

// getChild reads the AtprotoRecord child; nil when there is none.
func (r *Reconciler) getChild(ctx context.Context, o *object) (*v1alpha1.AtprotoRecord, error) {
	var child v1alpha1.AtprotoRecord
	if err := r.Client.Get(ctx, r.childKey(o), &child); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return &child, nil
}

// applyChild creates or updates the child with the record value and swapCid; deletionPolicy
// is always Retain: the record outlives the object.
func (r *Reconciler) applyChild(ctx context.Context, o *object, child *v1alpha1.AtprotoRecord, b *binding, value []byte, swapCID string) error {
	// A new child creates its record create-only: never over a record someone else wrote
	// meanwhile, and never again once it is deleted (a Both object deletes itself then). A
	// child that has seen its record and is told to create it again (a Publish record that
	// was deleted) writes it again.
	createOnly := swapCID == "" && (child == nil || (child.Spec.CreateOnly && child.Status.CID == ""))
	spec := v1alpha1.AtprotoRecordSpec{RepoRef: b.repoRef, Collection: r.Kind.Collection(), RKey: b.rkey,
		Record: runtime.RawExtension{Raw: value}, SwapCID: swapCID, CreateOnly: createOnly, DeletionPolicy: v1alpha1.DeletionPolicyRetain}
	if child == nil {
		k := r.childKey(o)
		// Created with the AtprotoRecord controller's finalizer already on: it would add it
		// as its first write anyway, and one write fewer per deployment counts at scale.
		child = &v1alpha1.AtprotoRecord{ObjectMeta: metav1.ObjectMeta{Name: k.Name, Namespace: k.Namespace,
			Labels:          map[string]string{v1alpha1.LabelInfraKind: string(r.Kind), v1alpha1.LabelInfraName: infra.LabelValue(o.obj.GetName())},
			OwnerReferences: []metav1.OwnerReference{r.ownerRef(o, true)},
			Finalizers:      []string{v1alpha1.FinalizerAtprotoRecord}}, Spec: spec}
		if err := r.Client.Create(ctx, child); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("atprotorecords").GroupResource(), k.Name, err)
			}
			return fmt.Errorf("creating record child %s: %w", k.Name, err)
		}
		return nil
	}
	if sameChildSpec(child.Spec, spec) || guardHolds(child, spec) {
		return nil
	}
	child.Spec = spec
	if err := r.Client.Update(ctx, child); err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return fmt.Errorf("updating record child %s: %w", child.Name, err)
	}
	return nil
}

// sameJSON reports whether a and b hold the same JSON value.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// sameChildSpec compares two child specs, the records as JSON values (the API server
// re-encodes what it stores).
func sameChildSpec(a, b v1alpha1.AtprotoRecordSpec) bool {
	ra, rb := a.Record, b.Record
	a.Record, b.Record = runtime.RawExtension{}, runtime.RawExtension{}
	return reflect.DeepEqual(a, b) && sameJSON(ra.Raw, rb.Raw)
}

// guardHolds reports whether child, as it stands, already guards its record as well as
// want would: want differs only by taking swapCid X where child is create-only, and child has
// written (or verified) this very value at cid X. A create-only child then refuses every write
// a swap on X refuses (another record at the path, or none after one was seen) and writes
// nothing while X is there, so moving it to the swap would cost two API writes (the update
// and the child's status after it) and change nothing. That is the common case: the first
// sync of every new deployment.
func guardHolds(child *v1alpha1.AtprotoRecord, want v1alpha1.AtprotoRecordSpec) bool {
	if !child.Spec.CreateOnly || child.Spec.SwapCID != "" || want.SwapCID == "" || child.Status.CID != want.SwapCID {
		return false
	}
	c := meta.FindStatusCondition(child.Status.Conditions, string(v1alpha1.ConditionInSync))
	if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != child.Generation {
		return false
	}
	as := child.Spec
	as.SwapCID, as.CreateOnly = want.SwapCID, want.CreateOnly
	return sameChildSpec(as, want)
}

// unbind handles an object whose spec.record was removed: the child goes (forced Retain),
// the record stays with its last content, direction Retained, Synced False Unbound.
func (r *Reconciler) unbind(ctx context.Context, p *pass) error {
	o := p.obj
	d := infra.Decide(infra.SyncInput{Bound: false, Stored: o.status.Record, Generation: o.obj.GetGeneration(), Now: p.now})
	if d.Action != infra.ActionUnbind {
		return nil
	}
	child, err := r.getChild(ctx, o)
	if err != nil {
		return err
	}
	if child != nil {
		if err := r.releaseWatch(ctx, o, child.Spec.RepoRef); err != nil {
			return err
		}
		if err := r.deleteChild(ctx, child); err != nil {
			return err
		}
	}
	o.status.Record = d.Record
	for _, c := range d.Conditions {
		meta.SetStatusCondition(&o.status.Conditions, c)
	}
	r.log().Info("infra_record_unbound", "object", o.obj.GetNamespace()+"/"+o.obj.GetName(), "uri", d.Record.URI)
	return nil
}

// deleteChild forces deletionPolicy Retain on the child, then deletes it: the record stays.
func (r *Reconciler) deleteChild(ctx context.Context, child *v1alpha1.AtprotoRecord) error {
	if child.Spec.DeletionPolicy != v1alpha1.DeletionPolicyRetain {
		child.Spec.DeletionPolicy = v1alpha1.DeletionPolicyRetain
		if err := r.Client.Update(ctx, child); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	if err := r.Client.Delete(ctx, child); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting record child %s: %w", child.Name, err)
	}
	return nil
}

func setCondition(o *object, t v1alpha1.ConditionType, ok bool, reason, msg string, now time.Time) {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&o.status.Conditions, metav1.Condition{Type: string(t), Status: s, Reason: reason, Message: msg,
		ObservedGeneration: o.obj.GetGeneration(), LastTransitionTime: metav1.NewTime(now)})
}
