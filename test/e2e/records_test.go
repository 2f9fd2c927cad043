package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/testenv"
)

func TestACC_RecordCreatedUpdatedInSync(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	repo := localRepo(t, env, "me")
	if repo.Status.DID != env.Account.DID || repo.Status.Handle != env.Account.Handle || repo.Status.Endpoint != env.PDS.URL() {
		t.Fatalf("repo status %+v, want did %s handle %s endpoint %s", repo.Status, env.Account.DID, env.Account.Handle, env.PDS.URL())
	}

	newRecord(t, env, "hello", "me", noteCollection, "hello", note("v1"))
	rec := waitRecord(t, env, "hello", v1alpha1.ReasonWritten)
	wantURI := "at://" + env.Account.DID + "/" + noteCollection + "/hello"
	if rec.Status.URI != wantURI || rec.Status.CID == "" || rec.Status.LastWriteAt == nil {
		t.Fatalf("status %+v, want uri %s, a cid and lastWriteAt", rec.Status, wantURI)
	}
	if !contains(rec.Finalizers, v1alpha1.FinalizerAtprotoRecord) {
		t.Fatalf("finalizers %v lack %s", rec.Finalizers, v1alpha1.FinalizerAtprotoRecord)
	}
	got, err := env.PDS.Repo(env.Account.DID).Get(ctx, noteCollection, "hello")
	if err != nil || got.CID != rec.Status.CID || !strings.Contains(string(got.Value), `"v1"`) {
		t.Fatalf("PDS holds %+v (%v), want cid %s with v1", got, err, rec.Status.CID)
	}

	// An update of the spec is written, with a new CID.
	rec.Spec.Record = raw(note("v2"))
	if err := env.Client.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	rec2 := waitRecord(t, env, "hello", v1alpha1.ReasonWritten)
	if rec2.Status.CID == rec.Status.CID {
		t.Fatalf("cid unchanged after update: %s", rec2.Status.CID)
	}
	got, _ = env.PDS.Repo(env.Account.DID).Get(ctx, noteCollection, "hello")
	if got.CID != rec2.Status.CID || !strings.Contains(string(got.Value), `"v2"`) {
		t.Fatalf("PDS holds %s %s, want %s with v2", got.CID, got.Value, rec2.Status.CID)
	}

	// A record already in the repo with the same content is InSync without a write.
	if _, _, err := env.PDS.Repo(env.Account.DID).Put(ctx, noteCollection, "pre", note("already"), nil); err != nil {
		t.Fatal(err)
	}
	newRecord(t, env, "pre", "me", noteCollection, "pre", note("already"))
	pre := waitRecord(t, env, "pre", v1alpha1.ReasonInSync)
	if pre.Status.LastWriteAt != nil || pre.Status.CID == "" {
		t.Fatalf("pre-existing record: status %+v, want a cid and no lastWriteAt", pre.Status)
	}
}

func TestACC_WatchSeesRecordEditedOnPDS(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	changes := make(chan string, 100)
	cancel := env.Broker.Subscribe(func(c watchChange) { changes <- string(c.Action) + " " + c.URI + " " + c.CID })
	defer cancel()
	newWatch(t, env, "notes", "me", noteCollection)
	waitWatch(t, env, "notes", "Ready", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		c := meta.FindStatusCondition(st.Conditions, string(v1alpha1.ConditionReady))
		return c != nil && c.Status == "True"
	})

	// A user edits the repo directly with putRecord over XRPC.
	user := userClient(t, env)
	res, err := user.PutRecord(ctx, noteCollection, "direct", note("typed by hand"), nil)
	if err != nil {
		t.Fatal(err)
	}
	st := waitWatch(t, env, "notes", "the direct write", func(st v1alpha1.AtprotoRecordWatchStatus) bool { return hasRecord(st, res.URI, res.CID) })
	if st.Cursor == 0 {
		t.Fatalf("cursor not kept: %+v", st)
	}
	expectChange(t, changes, "create "+res.URI+" "+res.CID)

	// Other collections are not listed.
	if _, err := user.PutRecord(ctx, "com.example.other", "x", map[string]any{"$type": "com.example.other"}, nil); err != nil {
		t.Fatal(err)
	}
	res2, err := user.PutRecord(ctx, noteCollection, "direct", note("edited"), nil)
	if err != nil {
		t.Fatal(err)
	}
	st = waitWatch(t, env, "notes", "the edit", func(st v1alpha1.AtprotoRecordWatchStatus) bool { return hasRecord(st, res.URI, res2.CID) })
	for _, r := range st.Records {
		if strings.Contains(r.URI, "com.example.other") {
			t.Fatalf("watch lists a record of another collection: %+v", st.Records)
		}
	}
	expectChange(t, changes, "update "+res.URI+" "+res2.CID)

	if _, err := user.DeleteRecord(ctx, noteCollection, "direct", nil); err != nil {
		t.Fatal(err)
	}
	st = waitWatch(t, env, "notes", "the delete", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return wasDeleted(st, res.URI) && !hasRecord(st, res.URI, "")
	})
	expectChange(t, changes, "delete "+res.URI+" ")
}

func expectChange(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("broker delivered %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("broker delivered nothing, want %q", want)
	}
}

func TestACC_SwapCidMismatchBlocksWrite(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	// The repo held "mine" and then someone else wrote "theirs" over it.
	pr := env.PDS.Repo(env.Account.DID)
	_, mine, err := pr.Put(ctx, noteCollection, "guarded", note("mine"), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, theirs, err := pr.Put(ctx, noteCollection, "guarded", note("theirs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The spec says: write only over my version.
	newRecord(t, env, "guarded", "me", noteCollection, "guarded", note("mine again"), func(r *v1alpha1.AtprotoRecord) { r.Spec.SwapCID = mine.CID })
	rec := waitRecord(t, env, "guarded", v1alpha1.ReasonSwapMismatch)
	c := meta.FindStatusCondition(rec.Status.Conditions, string(v1alpha1.ConditionInSync))
	if c.Status != "False" || !strings.Contains(c.Message, mine.CID) || !strings.Contains(c.Message, theirs.CID) {
		t.Fatalf("condition %+v should be False and name both %s and %s", c, mine.CID, theirs.CID)
	}
	if rec.Status.LastWriteAt != nil {
		t.Fatalf("lastWriteAt set without a write: %+v", rec.Status)
	}
	got, _ := pr.Get(ctx, noteCollection, "guarded")
	if got.CID != theirs.CID {
		t.Fatalf("the write went through: repo holds %s %s", got.CID, got.Value)
	}

	// With the swap naming what the repo holds, the write goes through.
	rec.Spec.SwapCID = theirs.CID
	if err := env.Client.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	rec = waitRecord(t, env, "guarded", v1alpha1.ReasonWritten)
	got, _ = pr.Get(ctx, noteCollection, "guarded")
	if got.CID != rec.Status.CID || !strings.Contains(string(got.Value), "mine again") {
		t.Fatalf("repo holds %s %s, want %s", got.CID, got.Value, rec.Status.CID)
	}
}

func TestACC_DriftRepairedThroughWatch(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	newWatch(t, env, "notes", "me", noteCollection)
	newRecord(t, env, "kept", "me", noteCollection, "kept", note("as declared"))
	rec := waitRecord(t, env, "kept", v1alpha1.ReasonWritten)
	declared := rec.Status.CID

	user := userClient(t, env)
	drift, err := user.PutRecord(ctx, noteCollection, "kept", note("drifted"), nil)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "drift repaired", func() (bool, error) {
		got, err := env.PDS.Repo(env.Account.DID).Get(ctx, noteCollection, "kept")
		if err != nil {
			return false, err
		}
		return got.CID == declared, nil
	})
	if drift.CID == declared {
		t.Fatal("the drifted record has the declared CID")
	}
	waitWatch(t, env, "notes", "the repaired record", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, rec.Status.URI, declared)
	})
}

func TestACC_FinalizerDeleteRetainAndInfraRecords(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	infra := map[string]any{"$type": "computer.socialweb.infra", "description": "kept forever", "createdAt": "2026-11-30T11:00:00.000Z"}
	retain := func(r *v1alpha1.AtprotoRecord) { r.Spec.DeletionPolicy = v1alpha1.DeletionPolicyRetain }
	del := func(r *v1alpha1.AtprotoRecord) { r.Spec.DeletionPolicy = v1alpha1.DeletionPolicyDelete }
	newRecord(t, env, "gone", "me", noteCollection, "gone", note("delete me"), del)
	newRecord(t, env, "kept", "me", noteCollection, "kept", note("retain me"), retain)
	newRecord(t, env, "deployment", "me", "computer.socialweb.infra", "self", infra, del)
	for _, n := range []string{"gone", "kept", "deployment"} {
		rec := waitRecord(t, env, n, v1alpha1.ReasonWritten)
		if err := env.Client.Delete(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"gone", "kept", "deployment"} {
		testenv.Eventually(t, 20*time.Second, n+" object deleted", func() (bool, error) {
			err := env.Client.Get(ctx, key(n), &v1alpha1.AtprotoRecord{})
			return apierrors.IsNotFound(err), err
		})
	}
	pr := env.PDS.Repo(env.Account.DID)
	if _, err := pr.Get(ctx, noteCollection, "gone"); err == nil || !strings.Contains(err.Error(), "RecordNotFound") {
		t.Errorf("Delete policy: record still there (%v)", err)
	}
	if _, err := pr.Get(ctx, noteCollection, "kept"); err != nil {
		t.Errorf("Retain policy: record gone: %v", err)
	}
	if _, err := pr.Get(ctx, "computer.socialweb.infra", "self"); err != nil {
		t.Errorf("infra record deleted under Delete: %v", err)
	}
}

func TestACC_InvalidRecordsReportedNeverWritten(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	const infraColl = "computer.socialweb.infra"
	valid := func() map[string]any {
		return map[string]any{"$type": infraColl, "description": "ok", "createdAt": "2026-11-30T11:00:00.000Z"}
	}
	with := func(k string, v any) map[string]any { m := valid(); m[k] = v; return m }
	without := func(k string) map[string]any { m := valid(); delete(m, k); return m }
	rows := []struct {
		name, collection string
		value            any
		want             string
	}{
		{"bad-type", infraColl, with("$type", "computer.socialweb.other"), "BadType"},
		{"bad-type-unknown", noteCollection, map[string]any{"$type": "com.example.other", "text": "x"}, "BadType"},
		{"missing-field", infraColl, without("createdAt"), "MissingField"},
		{"wrong-type", infraColl, with("description", 5), "WrongType"},
		{"too-long", infraColl, with("description", strings.Repeat("x", 4000)), "TooLong"},
		{"bad-format", infraColl, with("createdAt", "yesterday"), "BadFormat"},
		// Over the PDS's 1 MiB record limit (the API server's own limit is about 1.5 MiB).
		{"oversize", noteCollection, note(strings.Repeat("y", 1100<<10)), "too long"},
	}
	for _, row := range rows {
		newRecord(t, env, row.name, "me", row.collection, row.name, row.value)
	}
	for _, row := range rows {
		rec := waitRecord(t, env, row.name, v1alpha1.ReasonInvalidRecord)
		c := meta.FindStatusCondition(rec.Status.Conditions, string(v1alpha1.ConditionInSync))
		if c.Status != "False" || !strings.Contains(c.Message, row.want) {
			t.Errorf("%s: condition %s/%s %q, want False with %s", row.name, c.Status, c.Reason, short(c.Message), row.want)
		}
		if _, err := env.PDS.Repo(env.Account.DID).Get(ctx, row.collection, row.name); err == nil {
			t.Errorf("%s: an invalid record was written", row.name)
		}
	}
	// The controller is still working: a valid record next to them is written.
	newRecord(t, env, "fine", "me", infraColl, "fine", valid())
	waitRecord(t, env, "fine", v1alpha1.ReasonWritten)
}

func short(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
