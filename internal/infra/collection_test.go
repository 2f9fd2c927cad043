package infra

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/util/validation"

	"socialweb.computer/api/v1alpha1"
)

func TestChildName(t *testing.T) {
	tests := []struct{ name, rkey, want string }{
		{"dns name", "web", "web"},
		{"dotted dns name", "web.prod", "web.prod"},
		{"tid", "3jui7kd54zh2y", "3jui7kd54zh2y"},
		{"upper case", "Web", ""},
		{"colon", "pre:fix", ""},
		{"underscore", "a_b", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ChildName(tc.rkey)
			if tc.want != "" && got != tc.want {
				t.Errorf("got %q; want %q", got, tc.want)
			}
			if tc.want == "" && (len(got) != 14 || got[:2] != "r-" || got != ChildName(tc.rkey)) {
				t.Errorf("got %q; want r-<12 hex>", got)
			}
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q: %v", got, errs)
			}
		})
	}
}

func TestPlanCollection(t *testing.T) {
	u := func(rkey string) string { return RecordURI("did:plc:me", KindInfra, rkey) }
	rec := func(rkey string) ListedRecord { return ListedRecord{Rkey: rkey, URI: u(rkey), CID: "c-" + rkey} }
	tests := []struct {
		name       string
		records    []ListedRecord
		objects    []ExistingObject
		wantCreate []ChildToCreate
		want       []v1alpha1.CollectionChild
	}{
		{name: "unbound record gets a child", records: []ListedRecord{rec("web")},
			wantCreate: []ChildToCreate{{Name: "web", URI: u("web")}},
			want:       []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", Name: "web"}}},
		{name: "record bound by a publishing infra", records: []ListedRecord{rec("web")},
			objects: []ExistingObject{{Name: "web", BoundURI: u("web")}},
			want:    []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", BoundBy: "web"}}},
		{name: "our own child exists", records: []ListedRecord{rec("web")},
			objects: []ExistingObject{{Name: "web", BoundURI: u("web"), OwnedByThisCollection: true}},
			want:    []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", Name: "web"}}},
		{name: "name taken by an unbound object", records: []ListedRecord{rec("web")},
			objects: []ExistingObject{{Name: "web"}},
			want:    []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", Conflict: "NameConflict"}}},
		{name: "name taken by an object bound elsewhere", records: []ListedRecord{rec("web")},
			objects: []ExistingObject{{Name: "web", BoundURI: u("other")}},
			want:    []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", Conflict: "NameConflict"}}},
		{name: "hashed name, sorted by rkey, self skipped", records: []ListedRecord{rec("self"), rec("b"), rec("A_1"), rec("a")},
			wantCreate: []ChildToCreate{{Name: ChildName("A_1"), URI: u("A_1")}, {Name: "a", URI: u("a")}, {Name: "b", URI: u("b")}},
			want: []v1alpha1.CollectionChild{{RKey: "A_1", URI: u("A_1"), CID: "c-A_1", Name: ChildName("A_1")},
				{RKey: "a", URI: u("a"), CID: "c-a", Name: "a"}, {RKey: "b", URI: u("b"), CID: "c-b", Name: "b"}}},
		{name: "a record whose rkey is another's hashed name conflicts once", records: []ListedRecord{rec("A_1"), rec(ChildName("A_1"))},
			wantCreate: []ChildToCreate{{Name: ChildName("A_1"), URI: u("A_1")}},
			want: []v1alpha1.CollectionChild{{RKey: "A_1", URI: u("A_1"), CID: "c-A_1", Name: ChildName("A_1")},
				{RKey: ChildName("A_1"), URI: u(ChildName("A_1")), CID: "c-" + ChildName("A_1"), Conflict: "NameConflict"}}},
		{name: "the same record listed twice", records: []ListedRecord{rec("web"), rec("web")},
			wantCreate: []ChildToCreate{{Name: "web", URI: u("web")}},
			want:       []v1alpha1.CollectionChild{{RKey: "web", URI: u("web"), CID: "c-web", Name: "web"}}},
		{name: "nothing listed deletes nothing", objects: []ExistingObject{{Name: "web", BoundURI: u("web"), OwnedByThisCollection: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PlanCollection(tc.records, tc.objects)
			if d := cmp.Diff(tc.wantCreate, got.Create, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("create (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.want, got.Children, cmpopts.EquateEmpty()); d != "" {
				t.Errorf("children (-want +got):\n%s", d)
			}
		})
	}
}

func TestChildSpec(t *testing.T) {
	repo := v1alpha1.ObjectRef{Name: "repo"}
	got := ChildSpec(repo, "at://did:plc:me/computer.socialweb.infra/web", []v1alpha1.ObjectRef{{Name: "es"}})
	want := v1alpha1.InfraSpec{Record: &v1alpha1.InfraRecordBinding{RepoRef: repo, URI: "at://did:plc:me/computer.socialweb.infra/web",
		EventSourceRefs: []v1alpha1.ObjectRef{{Name: "es"}}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestWatchName(t *testing.T) {
	long := strings.Repeat("r", 80)
	for _, tc := range []struct {
		kind Kind
		ref  v1alpha1.ObjectRef
		want string
	}{
		{KindInfra, v1alpha1.ObjectRef{Name: "me"}, "infra-records-me"},
		{KindEphemeralInfra, v1alpha1.ObjectRef{Name: "me"}, "einfra-records-me"},
		{KindInfra, v1alpha1.ObjectRef{Name: "me", Namespace: "acct-x"}, "infra-records-me.acct-x"},
		{KindInfra, v1alpha1.ObjectRef{Name: long}, LabelValue("infra-records-" + long)},
	} {
		got := WatchName(tc.kind, tc.ref)
		if got != tc.want || len(got) > 63 {
			t.Errorf("WatchName(%s, %+v) = %q, want %q", tc.kind, tc.ref, got, tc.want)
		}
	}
}
