package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/testenv"
)

// ACC29 U1-UNBIND: removing spec.record drops the child and keeps the record with its last
// content; direction Retained, Synced False Unbound. Binding again follows the first-sync rule.
func TestACC29_U1Unbind(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	newInfra(t, env, "web", "bound", []string{"api"})
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	_, cid := pdsInfra(t, env, "web")

	editInfra(t, env, "web", func(i *v1alpha1.Infra) { i.Spec.Record, i.Spec.Description = nil, "after unbind" })
	waitInfra(t, env, "web", "unbound", func(got *v1alpha1.Infra) bool {
		return got.Status.Record != nil && got.Status.Record.Direction == v1alpha1.RecordRetained &&
			condIs(got, v1alpha1.ConditionSynced, metav1.ConditionFalse, infra.ReasonSyncUnbound)
	})
	testenv.Eventually(t, 20*time.Second, "the record child is gone", func() (bool, error) {
		var c v1alpha1.AtprotoRecord
		err := env.Client.Get(ctx, key("infra-web"), &c)
		return apierrors.IsNotFound(err), err
	})
	rec, cid2 := pdsInfra(t, env, "web")
	if rec == nil || cid2 != cid || *rec.Description != "bound" {
		t.Fatalf("record after unbind: %s cid %s, want the last content at %s", statusJSON(rec), cid2, cid)
	}

	// Binding again: the record exists and the spec changed meanwhile: first sync, the record wins.
	editInfra(t, env, "web", func(i *v1alpha1.Infra) {
		i.Spec.Record = &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}}
	})
	waitInfra(t, env, "web", "rebound", func(got *v1alpha1.Infra) bool {
		return got.Spec.Description == "bound" && inSync(v1alpha1.RecordPulled)(got)
	})
}

// ACC29 PUBLISH-OVERWRITE: under sync Publish a record edited elsewhere is overwritten with a
// compare-and-swap, and a deleted one is written again; the object never pulls.
func TestACC29_PublishOverwrite(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	newWatch(t, env, "notes", "me", noteCollection) // unrelated watch: only its own collection
	newInfra(t, env, "web", "the truth", []string{"api"}, func(i *v1alpha1.Infra) { i.Spec.Record.Sync = v1alpha1.RecordSyncPublish })
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))

	rec, _ := pdsInfra(t, env, "web")
	rec.Description = strp("vandalised")
	rec.Contracts = staged("intruder")
	edited := putInfra(t, env, "web", *rec)
	testenv.Eventually(t, 30*time.Second, "the edit is overwritten", func() (bool, error) {
		r, cid := pdsInfra(t, env, "web")
		return r != nil && cid != edited && *r.Description == "the truth", nil
	})
	inf := waitInfra(t, env, "web", "in sync again", inSync(v1alpha1.RecordInSync))
	if inf.Spec.Description != "the truth" || !slices.Equal(contractNames(inf.Spec.Contracts), []string{"api"}) {
		t.Fatalf("Publish pulled: spec %+v", inf.Spec)
	}

	if _, err := env.PDS.Repo(env.Account.DID).Delete(ctx, infraNSID, "web", nil); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the deleted record is written again", func() (bool, error) {
		r, _ := pdsInfra(t, env, "web")
		return r != nil && *r.Description == "the truth", nil
	})
	var still v1alpha1.Infra
	if err := env.Client.Get(ctx, key("web"), &still); err != nil || still.DeletionTimestamp != nil {
		t.Fatalf("Publish object deleted with its record: %v %v", err, still.DeletionTimestamp)
	}
}

// Successor rkeys: a deleted object leaves its record ended; a new object of the same name
// takes <name>-<uid8>. The index at self lists live records and, newest first, recent ends.
func TestACC29_SuccessorAndIndex(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	first := newInfra(t, env, "web", "first", []string{"api"})
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	newInfra(t, env, "other", "other", nil)
	waitInfra(t, env, "other", "in sync", inSync(v1alpha1.RecordInSync))
	testenv.Eventually(t, 20*time.Second, "both live in the index", func() (bool, error) {
		live := liveRkeys(readIndex(t, env))
		return slices.Contains(live, "web") && slices.Contains(live, "other"), nil
	})

	if err := env.Client.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "web is released and gone", func() (bool, error) {
		var inf v1alpha1.Infra
		err := env.Client.Get(ctx, key("web"), &inf)
		return apierrors.IsNotFound(err), err
	})
	rec, _ := pdsInfra(t, env, "web")
	if rec == nil || rec.Status == nil || *rec.Status.Phase != "ended" || rec.Status.EndReason == nil || *rec.Status.EndReason != "deleted" || rec.Status.EndedAt == nil {
		t.Fatalf("final write: %s, want phase ended, endReason deleted, endedAt", statusJSON(rec))
	}
	idx := readIndex(t, env)
	if slices.Contains(liveRkeys(idx), "web") || len(idx.RecentEnded) == 0 || idx.RecentEnded[0].Rkey != "web" || *idx.RecentEnded[0].EndReason != "deleted" {
		t.Fatalf("index after delete: %s", statusJSON(idx))
	}
	var c v1alpha1.AtprotoRecord
	if err := env.Client.Get(ctx, key("infra-web"), &c); !apierrors.IsNotFound(err) {
		t.Fatalf("record child left behind: %v", err)
	}

	second := newInfra(t, env, "web", "second", []string{"api"})
	inf := waitInfra(t, env, "web", "in sync at a successor", inSync(v1alpha1.RecordInSync))
	uid8 := string(inf.UID)[:8]
	want := "at://" + env.Account.DID + "/" + infraNSID + "/web-" + uid8
	if inf.Status.Record.URI != want {
		t.Fatalf("uri %s, want %s", inf.Status.Record.URI, want)
	}
	if old, _ := pdsInfra(t, env, "web"); *old.Description != "first" || *old.Status.Phase != "ended" {
		t.Fatalf("the ended record was written again: %s", statusJSON(old))
	}
	testenv.Eventually(t, 20*time.Second, "the successor is live in the index", func() (bool, error) {
		return slices.Contains(liveRkeys(readIndex(t, env)), "web-"+uid8), nil
	})
	_ = second
}
