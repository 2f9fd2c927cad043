package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/testenv"
)

// putEphemeral writes an ephemeralInfra record straight to the PDS.
func putEphemeral(t *testing.T, env *testenv.Env, rkey string, rec atinfra.EphemeralInfra) {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, _, err := env.PDS.Repo(env.Account.DID).Put(context.Background(), ephemeralInfraNSID, rkey, m, nil); err != nil {
		t.Fatal(err)
	}
}

// ACC29 COLLECTION-ENUMERATE for the ephemeral kind: an EphemeralInfraCollection lists the
// record a publishing EphemeralInfra binds as boundBy, gives the live record written straight
// to the PDS a child EphemeralInfra that pulls its declaration, and leaves out a record past
// its deadline (not live).
func TestACC29_EphemeralCollectionEnumerate(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	pub := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "published", Namespace: ns},
		Spec: v1alpha1.EphemeralInfraSpec{TTLSeconds: 3600, InfraSpec: v1alpha1.InfraSpec{Description: "from kcp",
			Contracts: []v1alpha1.InfraContract{{Name: "api"}}, Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}}}}}
	if err := env.Client.Create(ctx, pub); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the published EphemeralInfra in sync", func() (bool, error) {
		var e v1alpha1.EphemeralInfra
		if err := env.Client.Get(ctx, key("published"), &e); err != nil {
			return false, err
		}
		return e.Status.Record != nil && e.Status.Record.Direction == v1alpha1.RecordInSync, nil
	})

	now := time.Now().UTC().Truncate(time.Second)
	putEphemeral(t, env, "handmade", atinfra.EphemeralInfra{CreatedAt: now.Format(time.RFC3339), TTLSeconds: 3600,
		Description: strp("typed by hand"), Contracts: staged("a", "b")})
	exp := now.Add(time.Hour)
	addIndexEntryOf(t, env, infra.KindEphemeralInfra, "handmade", now, &exp, "cli")
	old := now.Add(-2 * time.Hour)
	putEphemeral(t, env, "stale", atinfra.EphemeralInfra{CreatedAt: old.Format(time.RFC3339), TTLSeconds: 60,
		Description: strp("long past its deadline")})
	oldExp := old.Add(time.Minute)
	addIndexEntryOf(t, env, infra.KindEphemeralInfra, "stale", old, &oldExp, "cli")

	col := &v1alpha1.EphemeralInfraCollection{ObjectMeta: metav1.ObjectMeta{Name: "mine", Namespace: ns},
		Spec: v1alpha1.InfraCollectionSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}}}
	if err := env.Client.Create(ctx, col); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.EphemeralInfraCollection
	testenv.Eventually(t, 30*time.Second, "both live records listed", func() (bool, error) {
		if err := env.Client.Get(ctx, key("mine"), &got); err != nil {
			return false, err
		}
		return child(got.Status.Children, "published") != nil && child(got.Status.Children, "handmade") != nil, nil
	})
	if p := child(got.Status.Children, "published"); p.BoundBy != "published" || p.Name != "" {
		t.Fatalf("published: %+v, want boundBy published and no child", p)
	}
	if h := child(got.Status.Children, "handmade"); h.Name != "handmade" || h.BoundBy != "" {
		t.Fatalf("handmade: %+v, want child handmade", h)
	}
	if s := child(got.Status.Children, "stale"); s != nil {
		t.Fatalf("stale: %+v, want a record past its deadline left out", s)
	}
	var e v1alpha1.EphemeralInfra
	testenv.Eventually(t, 30*time.Second, "the child pulled the record", func() (bool, error) {
		if err := env.Client.Get(ctx, key("handmade"), &e); err != nil {
			return false, err
		}
		return e.Status.Record != nil && e.Status.Record.Direction == v1alpha1.RecordPulled &&
			e.Spec.Description == "typed by hand", nil
	})
	if !slices.Equal(contractNames(e.Spec.Contracts), []string{"a", "b"}) {
		t.Fatalf("child contracts %v, want the record's", contractNames(e.Spec.Contracts))
	}
	if e.Labels[v1alpha1.LabelInfraCollection] != "mine" || metav1.GetControllerOf(&e) == nil || metav1.GetControllerOf(&e).Kind != "EphemeralInfraCollection" {
		t.Fatalf("child labels %v owner %v", e.Labels, e.OwnerReferences)
	}
	if e.Spec.Record == nil || e.Spec.Record.URI != "at://"+env.Account.DID+"/"+ephemeralInfraNSID+"/handmade" {
		t.Fatalf("child binding %+v", e.Spec.Record)
	}
	if err := env.Client.Get(ctx, key("stale"), &v1alpha1.EphemeralInfra{}); err == nil {
		t.Fatal("a child was made for the record past its deadline")
	}
}
