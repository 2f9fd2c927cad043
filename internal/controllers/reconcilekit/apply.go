package reconcilekit

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/csaupgrade"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// StatusOwner is one writer of a status that several write (the Cluster's: its controller
// and the node host): the field manager its applies are recorded under and the part of the
// status it owns. The API server merges the writers' applies field by field, and the
// conditions by type (their list is a map keyed by type in the CRD), so no writer's apply
// can drop another's fields.
type StatusOwner struct {
	// Manager is the field manager of the writer's applies.
	Manager string
	// Fields are the status fields the writer owns, by their JSON names; conditions go in
	// Conditions.
	Fields []string
	// Conditions are the types of the conditions the writer owns.
	Conditions []string
}

// ApplyStatus writes o's part of obj's status by server-side apply on the status
// subresource, when it differs from stored's: the object applied carries only apiVersion,
// kind, name, namespace and o's fields as they are on obj, so a field o does not own is
// never sent, and a field o owns but obj leaves empty is removed (o owned it and no longer
// sets it). A condition is sent whole: the writer computes it against the stored one
// (meta.SetStatusCondition keeps its lastTransitionTime while its status holds).
//
// No resourceVersion is sent, so there is no conflict to retry: the server merges this
// apply with the other writers' fields. The price is that a field obj keeps "as it was" is
// written back as this writer read it. written says whether it applied; on a write obj is
// the object the API server returned.
//
// Before its first apply on an object whose status was written by merge patch, the
// writer's fields are moved from that patch's manager to o.Manager (upgradeStatusManagers).
// A conflict there (the object moved on since obj was read) comes back as the error (see
// Settle).
func ApplyStatus(ctx context.Context, c client.Client, o StatusOwner, stored, obj client.Object) (written bool, err error) {
	want, changed, err := o.changed(stored, obj)
	if err != nil || !changed {
		return false, err
	}
	if err := upgradeStatusManagers(ctx, c, o, obj); err != nil {
		return false, err
	}
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return false, err
	}
	u := &unstructured.Unstructured{Object: map[string]any{"status": want}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(obj.GetNamespace())
	u.SetName(obj.GetName())
	if err := c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(o.Manager), client.ForceOwnership); err != nil {
		return false, err
	}
	v := reflect.ValueOf(obj).Elem()
	v.Set(reflect.Zero(v.Type()))
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		return true, fmt.Errorf("reading the applied %s %s: %w", gvk.Kind, client.ObjectKeyFromObject(u), err)
	}
	return true, nil
}

// changed reports whether o's part of obj's status differs from stored's, and returns
// obj's (what an apply sends).
func (o StatusOwner) changed(stored, obj client.Object) (want map[string]any, changed bool, err error) {
	if want, err = o.project(obj); err != nil {
		return nil, false, err
	}
	have, err := o.project(stored)
	if err != nil {
		return nil, false, err
	}
	return want, !equality.Semantic.DeepEqual(have, want), nil
}

// project returns o's part of obj's status as it would be applied: the owned fields obj
// sets (empty ones are left out, as their JSON is) and the owned conditions, in obj's order.
func (o StatusOwner) project(obj client.Object) (map[string]any, error) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("status of %T: not a pointer to a struct", obj)
	}
	f := v.Elem().FieldByName("Status")
	if !f.IsValid() || f.Kind() != reflect.Struct {
		return nil, fmt.Errorf("%T has no status struct", obj)
	}
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f.Addr().Interface())
	if err != nil {
		return nil, fmt.Errorf("status of %T: %w", obj, err)
	}
	out := map[string]any{}
	for _, name := range o.Fields {
		if x, ok := status[name]; ok {
			out[name] = x
		}
	}
	conds, _ := status["conditions"].([]any)
	var own []any
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && slices.Contains(o.Conditions, fmt.Sprint(m["type"])) {
			own = append(own, c)
		}
	}
	if len(own) > 0 {
		out["conditions"] = own
	}
	return out, nil
}

// matcher matches the paths of the managed fields o owns in a status.
func (o StatusOwner) matcher() *fieldpath.SetMatcher {
	m := &fieldpath.SetMatcher{}
	for _, name := range o.Fields {
		m = m.Merge(fieldpath.MakePrefixMatcherOrDie("status", name))
	}
	for _, t := range o.Conditions {
		m = m.Merge(fieldpath.MakePrefixMatcherOrDie("status", "conditions", fieldpath.KeyByFields("type", t)))
	}
	return m
}

// legacyStatusManagers are the names the API server recorded for the status writes made
// by merge patch before these writers applied: controller-runtime's client sent no field
// manager, so the server named the writer after its user agent's product, client-go's
// default: the binary's name (socialweb, or a test binary's).
var legacyStatusManagers = sets.New("socialweb", strings.Split(rest.DefaultKubernetesUserAgent(), "/")[0])

// upgradeStatusManagers moves o's fields of obj's status from the managers of the old
// merge patches (legacyStatusManagers) to o.Manager, once, before o's first apply.
//
// Why: a merge patch is recorded as an Update by one manager, which then co-owns every
// field it wrote; the server removes a field an applier stops sending only when no other
// manager owns it, so without this a field o clears (teardownBlocked, a condition it no
// longer sets) would stay forever on an object written before apply.
//
// csaupgrade does the move, but it hands a manager's whole field set over, and every writer
// of a status here patched under the same manager name: so only the paths o owns are handed
// over, and what is left (the other writers' fields, for their own upgrade) stays with the
// old manager. The patch replaces the managed fields guarded by obj's resourceVersion, as
// csaupgrade's own patch does.
func upgradeStatusManagers(ctx context.Context, c client.Client, o StatusOwner, obj client.Object) error {
	entries, changed, err := upgradedStatusManagers(obj.GetManagedFields(), o)
	if err != nil || !changed {
		return err
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "replace", "path": "/metadata/managedFields", "value": entries},
		{"op": "replace", "path": "/metadata/resourceVersion", "value": obj.GetResourceVersion()},
	})
	if err != nil {
		return err
	}
	// A copy takes the answer: obj keeps the status this writer wants.
	return c.Patch(ctx, obj.DeepCopyObject().(client.Object), client.RawPatch(types.JSONPatchType, patch))
}

// upgradedStatusManagers returns entries with o's status paths moved from the legacy
// Update managers to o's Apply manager, and whether anything moved.
func upgradedStatusManagers(entries []metav1.ManagedFieldsEntry, o StatusOwner) ([]metav1.ManagedFieldsEntry, bool, error) {
	mine := o.matcher()
	var kept, rest []metav1.ManagedFieldsEntry
	moved := false
	for _, e := range entries {
		if e.Operation != metav1.ManagedFieldsOperationUpdate || e.Subresource != "status" || !legacyStatusManagers.Has(e.Manager) {
			kept = append(kept, e)
			continue
		}
		// Only the legacy entries restricted to o's paths are left for csaupgrade to see.
		if e.FieldsV1 == nil {
			rest = append(rest, e)
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(e.FieldsV1.GetRawReader()); err != nil {
			return nil, false, fmt.Errorf("managed fields of %s: %w", e.Manager, err)
		}
		owned := set.FilterIncludeMatches(mine)
		if owned.Empty() {
			rest = append(rest, e)
			continue
		}
		moved = true
		ownedEntry, err := withFields(e, owned)
		if err != nil {
			return nil, false, err
		}
		kept = append(kept, ownedEntry)
		if left := set.Difference(owned); !left.Empty() {
			leftEntry, err := withFields(e, left)
			if err != nil {
				return nil, false, err
			}
			rest = append(rest, leftEntry)
		}
	}
	if !moved {
		return entries, false, nil
	}
	u := &unstructured.Unstructured{}
	u.SetManagedFields(kept)
	if err := csaupgrade.UpgradeManagedFields(u, legacyStatusManagers, o.Manager, csaupgrade.Subresource("status")); err != nil {
		return nil, false, err
	}
	return append(u.GetManagedFields(), rest...), true, nil
}

// withFields is e holding set instead of its own fields.
func withFields(e metav1.ManagedFieldsEntry, set *fieldpath.Set) (metav1.ManagedFieldsEntry, error) {
	raw, err := set.ToJSON()
	if err != nil {
		return e, err
	}
	e.FieldsV1 = metav1.NewFieldsV1(string(raw))
	return e, nil
}
