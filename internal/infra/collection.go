package infra

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"

	"k8s.io/apimachinery/pkg/util/validation"

	"socialweb.computer/api/v1alpha1"
)

// ChildName is the name of a collection's child object for the record at rkey: the rkey
// itself when it is a DNS-1123 name, else r-<12 hex of sha256(rkey)>.
func ChildName(rkey string) string {
	if len(validation.IsDNS1123Subdomain(rkey)) == 0 {
		return rkey
	}
	sum := sha256.Sum256([]byte(rkey))
	return "r-" + hex.EncodeToString(sum[:])[:12]
}

// ListedRecord is one live record of the collection's kind in the repo (from the index at
// self, or from listRecords when there is no usable index).
type ListedRecord struct {
	Rkey string
	URI  string
	CID  string
}

// ExistingObject is one object of the collection's kind in the workspace.
type ExistingObject struct {
	Name string
	// BoundURI is the record it binds: spec.record.uri, else status.record.uri (a publishing object).
	BoundURI string
	// OwnedByThisCollection is true for the collection's own children.
	OwnedByThisCollection bool
}

// ChildToCreate is a child the collection creates: name, and the uri its spec.record follows.
type ChildToCreate struct {
	Name string
	URI  string
}

// CollectionPlan is what one pass of a collection does: the children to create and
// status.children, one entry per record, sorted by rkey.
type CollectionPlan struct {
	Create   []ChildToCreate
	Children []v1alpha1.CollectionChild
}

// PlanCollection maps the repo's live records to children: a record some object already binds
// is listed with that object (its child, by Name; another object, by BoundBy, and no child);
// an unbound record gets a child named ChildName(rkey), unless an object that binds something
// else holds that name (Conflict NameConflict). The record at self is the index and never a
// child. The plan never deletes: a child whose record is gone deletes itself (Decide's Delete).
func PlanCollection(records []ListedRecord, objects []ExistingObject) CollectionPlan {
	recs := append([]ListedRecord(nil), records...)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Rkey < recs[j].Rkey })
	byURI := map[string]ExistingObject{}
	byName := map[string]ExistingObject{}
	for _, o := range objects {
		byName[o.Name] = o
		if o.BoundURI == "" {
			continue
		}
		// A child of this collection is the binding to report when another object binds the same uri too.
		if prev, ok := byURI[o.BoundURI]; !ok || (o.OwnedByThisCollection && !prev.OwnedByThisCollection) {
			byURI[o.BoundURI] = o
		}
	}
	var plan CollectionPlan
	seen := map[string]bool{}
	for _, r := range recs {
		if r.Rkey == RkeySelf || seen[r.URI] {
			continue
		}
		seen[r.URI] = true
		child := v1alpha1.CollectionChild{RKey: r.Rkey, URI: r.URI, CID: r.CID}
		if o, ok := byURI[r.URI]; ok {
			if o.OwnedByThisCollection {
				child.Name = o.Name
			} else {
				child.BoundBy = o.Name
			}
			plan.Children = append(plan.Children, child)
			continue
		}
		name := ChildName(r.Rkey)
		if _, taken := byName[name]; taken {
			child.Conflict = string(v1alpha1.ReasonNameConflict)
			plan.Children = append(plan.Children, child)
			continue
		}
		child.Name = name
		byName[name] = ExistingObject{Name: name, BoundURI: r.URI, OwnedByThisCollection: true}
		plan.Create = append(plan.Create, ChildToCreate{Name: name, URI: r.URI})
		plan.Children = append(plan.Children, child)
	}
	return plan
}

// ChildSpec is the whole spec a collection writes on a child: only spec.record, following the
// record. The child's first sync pulls the declaration.
func ChildSpec(repoRef v1alpha1.ObjectRef, uri string, eventSourceRefs []v1alpha1.ObjectRef) v1alpha1.InfraSpec {
	// A copy: the child's spec must not share its backing array with the collection's.
	refs := append([]v1alpha1.ObjectRef(nil), eventSourceRefs...)
	return v1alpha1.InfraSpec{Record: &v1alpha1.InfraRecordBinding{RepoRef: repoRef, URI: uri, EventSourceRefs: refs}}
}

// WatchName is the name of the AtprotoRecordWatch that follows kind's collection in the repo
// named by repoRef: one per repo and collection in a namespace, shared by every deployment
// and collection bound through that repo. <prefix>records-<repo>, with the repo's namespace
// when it names another, hashed past 63 characters.
func WatchName(kind Kind, repoRef v1alpha1.ObjectRef) string {
	n := kind.prefix() + "records-" + repoRef.Name
	if repoRef.Namespace != "" {
		n += "." + repoRef.Namespace
	}
	return LabelValue(n)
}
