package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	infractl "socialweb.computer/internal/controllers/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/testenv"
)

func newCollection(t *testing.T, env *testenv.Env, name string) {
	t.Helper()
	c := &v1alpha1.InfraCollection{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.InfraCollectionSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}}}
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
}

func waitCollection(t *testing.T, env *testenv.Env, name, what string, cond func(*v1alpha1.InfraCollection) bool) *v1alpha1.InfraCollection {
	t.Helper()
	var c v1alpha1.InfraCollection
	testenv.Eventually(t, 30*time.Second, "collection "+name+": "+what, func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &c); err != nil {
			return false, err
		}
		return cond(&c), nil
	})
	return &c
}

func child(cs []v1alpha1.CollectionChild, rkey string) *v1alpha1.CollectionChild {
	for i := range cs {
		if cs[i].RKey == rkey {
			return &cs[i]
		}
	}
	return nil
}

// ACC29 COLLECTION-ENUMERATE: two records, one bound by a publishing Infra and one written
// straight to the PDS: the first is listed as boundBy, the second gets a child that pulls.
func TestACC29_CollectionEnumerate(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	localRepo(t, env, "me")
	newInfra(t, env, "published", "from kcp", []string{"api"})
	waitInfra(t, env, "published", "in sync", inSync(v1alpha1.RecordInSync))
	putInfra(t, env, "handmade", atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: strp("typed by hand"), Contracts: staged("a", "b")})
	// A writer that follows the lexicon adds its entry to the index at self (here a CLI).
	addIndexEntry(t, env, "handmade", "cli")

	newCollection(t, env, "mine")
	col := waitCollection(t, env, "mine", "both records listed", func(c *v1alpha1.InfraCollection) bool {
		return child(c.Status.Children, "published") != nil && child(c.Status.Children, "handmade") != nil
	})
	if p := child(col.Status.Children, "published"); p.BoundBy != "published" || p.Name != "" {
		t.Fatalf("published: %+v, want boundBy published and no child", p)
	}
	if h := child(col.Status.Children, "handmade"); h.Name != "handmade" || h.BoundBy != "" {
		t.Fatalf("handmade: %+v, want child handmade", h)
	}
	inf := waitInfra(t, env, "handmade", "pulled", inSync(v1alpha1.RecordPulled))
	if inf.Spec.Description != "typed by hand" || !slices.Equal(contractNames(inf.Spec.Contracts), []string{"a", "b"}) {
		t.Fatalf("child spec %+v, want the record's declaration", inf.Spec)
	}
	if inf.Labels[v1alpha1.LabelInfraCollection] != "mine" || metav1.GetControllerOf(inf) == nil || metav1.GetControllerOf(inf).Name != "mine" {
		t.Fatalf("child labels %v owner %v", inf.Labels, inf.OwnerReferences)
	}
	if inf.Spec.Record == nil || inf.Spec.Record.URI != "at://"+env.Account.DID+"/"+infraNSID+"/handmade" {
		t.Fatalf("child binding %+v", inf.Spec.Record)
	}

	// A name taken by an unbound object is a NameConflict.
	plain := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: ns}}
	if err := env.Client.Create(context.Background(), plain); err != nil {
		t.Fatal(err)
	}
	putInfra(t, env, "taken", atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: strp("clash")})
	addIndexEntry(t, env, "taken", "cli")
	waitCollection(t, env, "mine", "name conflict", func(c *v1alpha1.InfraCollection) bool {
		ch := child(c.Status.Children, "taken")
		return ch != nil && ch.Conflict == string(v1alpha1.ReasonNameConflict) && ch.Name == ""
	})
}

// ACC29 REMOTE-DELETE: deleteRecord on the PDS removes that child (it deletes itself), and
// the collection does not create it again.
func TestACC29_RemoteDelete(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	putInfra(t, env, "doomed", atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: strp("short-lived"), Contracts: staged("a")})
	putInfra(t, env, "kept", atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: strp("stays")})
	newCollection(t, env, "mine")
	waitInfra(t, env, "doomed", "pulled", inSync(v1alpha1.RecordPulled))
	waitInfra(t, env, "kept", "pulled", inSync(v1alpha1.RecordPulled))

	if _, err := env.PDS.Repo(env.Account.DID).Delete(ctx, infraNSID, "doomed", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the child of the deleted record is gone", func() (bool, error) {
		var inf v1alpha1.Infra
		err := env.Client.Get(ctx, key("doomed"), &inf)
		return apierrors.IsNotFound(err), err
	})
	waitCollection(t, env, "mine", "the deleted record no longer listed", func(c *v1alpha1.InfraCollection) bool {
		return child(c.Status.Children, "doomed") == nil && child(c.Status.Children, "kept") != nil
	})
	// Not recreated: neither the record (the final write skips a gone record) nor the child.
	var inf v1alpha1.Infra
	if err := env.Client.Get(ctx, key("doomed"), &inf); !apierrors.IsNotFound(err) {
		t.Fatalf("child recreated: %v", err)
	}
	if rec, _ := pdsInfra(t, env, "doomed"); rec != nil {
		t.Fatalf("record recreated: %s", statusJSON(rec))
	}
	if rec, _ := pdsInfra(t, env, "kept"); rec == nil {
		t.Fatal("the other record is gone")
	}
}

// addIndexEntry adds a live entry to the index at self with a swap on the cid read, as any
// writer of the repo does.
func addIndexEntry(t *testing.T, env *testenv.Env, rkey, writer string) {
	t.Helper()
	addIndexEntryOf(t, env, infra.KindInfra, rkey, time.Now(), nil, writer)
}

// addIndexEntryOf adds a live entry of kind to the index at self (createdAt, and expiresAt
// for an ephemeral record).
func addIndexEntryOf(t *testing.T, env *testenv.Env, kind infra.Kind, rkey string, createdAt time.Time, expiresAt *time.Time, writer string) {
	t.Helper()
	ctx := context.Background()
	repo, err := repos.Local(ctx, env.PDS, env.Account.DID)
	if err != nil {
		t.Fatal(err)
	}
	for {
		idx, selfCreatedAt, swap, err := infractl.ReadIndex(ctx, repo)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		next, changed := infra.IndexPass(idx, infra.IndexEntryFor(kind, rkey, createdAt, expiresAt, writer), true, now)
		if !changed {
			return
		}
		if selfCreatedAt == "" {
			selfCreatedAt = now.UTC().Format(time.RFC3339)
		}
		b, _ := json.Marshal(atinfra.Infra{CreatedAt: selfCreatedAt, Index: next})
		if _, err := repo.Put(ctx, infraNSID, "self", b, &swap); err == nil {
			return
		} else if !errors.Is(err, repos.ErrSwapMismatch) {
			t.Fatal(err)
		}
	}
}

// Past 256 live index entries the index is full and may have left records out: the
// collection pages listRecords instead, so a record missing from the index is still enumerated.
func TestACC29_CollectionEnumeratesPastAFullIndex(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	now := time.Now()
	var idx *atinfra.InfraIndex
	for i := 0; i < infra.IndexMaxLive; i++ {
		idx, _ = infra.IndexPass(idx, infra.IndexEntryFor(infra.KindInfra, "listed-"+itoa(int64(i)), now, nil, "cli"), true, now)
	}
	b, _ := json.Marshal(atinfra.Infra{CreatedAt: now.UTC().Format(time.RFC3339), Index: idx})
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	if _, _, err := env.PDS.Repo(env.Account.DID).Put(ctx, infraNSID, "self", m, nil); err != nil {
		t.Fatal(err)
	}
	if infra.IndexComplete(idx) {
		t.Fatal("a 256-entry index counts as complete")
	}
	putInfra(t, env, "unindexed", atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: strp("not in the index")})
	newCollection(t, env, "mine")
	col := waitCollection(t, env, "mine", "the unindexed record enumerated", func(c *v1alpha1.InfraCollection) bool {
		ch := child(c.Status.Children, "unindexed")
		return ch != nil && ch.Name == "unindexed"
	})
	if c := col.Status.Conditions; len(c) == 0 || !strings.Contains(c[0].Message, "listRecords") {
		t.Fatalf("conditions %+v, want the listRecords path", c)
	}
	waitInfra(t, env, "unindexed", "pulled", inSync(v1alpha1.RecordPulled))
}
