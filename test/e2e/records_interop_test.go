package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds/refpds"
	"socialweb.computer/internal/testenv"
)

// The AtprotoRecord and AtprotoRecordWatch rows again, through a remote AtprotoRepo on the
// reference PDS (@atproto/pds). Runs when CI=true or SOCIALWEB_INTEROP=1, like
// internal/pds/interop.
func TestACC_Interop_RemoteRepoOnReferencePDS(t *testing.T) {
	peer := refpds.Require(t)
	ctx := context.Background()
	const handle, password = "records.test", "records-pw-1"
	user := atclient.New(peer.PDSURL)
	sess, err := user.CreateAccount(ctx, handle, password, "records@example.test")
	if err != nil {
		t.Fatalf("account on the reference PDS: %v", err)
	}
	env := testenv.Start(t, testenv.Options{Controllers: true})

	// A wrong password: LoginFailed, and the AtprotoRepo does not retry in a storm.
	remoteRepo(t, env, "wrong", peer.PDSURL, handle, "not-the-password")
	waitRepoReason(t, env, "wrong", v1alpha1.ReasonLoginFailed)

	remoteRepo(t, env, "ref", peer.PDSURL, handle, password)
	r := waitRepoReason(t, env, "ref", v1alpha1.ReasonLoggedIn)
	if r.Status.DID != sess.DID {
		t.Fatalf("status did %s, want %s", r.Status.DID, sess.DID)
	}
	newWatch(t, env, "notes", "ref", noteCollection)

	// Written, and seen by the watch.
	newRecord(t, env, "hello", "ref", noteCollection, "hello", note("v1"))
	rec := waitRecord(t, env, "hello", v1alpha1.ReasonWritten)
	waitWatch(t, env, "notes", "the written record", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return hasRecord(st, rec.Status.URI, rec.Status.CID)
	})

	// Edited directly on the reference PDS: the watch shows it and the controller repairs it.
	edited, err := user.PutRecord(ctx, noteCollection, "hello", note("by hand"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if edited.CID == rec.Status.CID {
		t.Fatal("edit has the declared CID")
	}
	testenv.Eventually(t, 30*time.Second, "drift repaired on the reference PDS", func() (bool, error) {
		got, err := user.GetRecord(ctx, "", noteCollection, "hello")
		return err == nil && got.CID == rec.Status.CID, err
	})

	// A swapCid mismatch blocks the write and says so.
	other, err := user.PutRecord(ctx, noteCollection, "guarded", note("theirs"), nil)
	if err != nil {
		t.Fatal(err)
	}
	newRecord(t, env, "guarded", "ref", noteCollection, "guarded", note("mine"), func(r *v1alpha1.AtprotoRecord) {
		r.Spec.SwapCID = rec.Status.CID // a CID the repo does not hold at this path
	})
	g := waitRecord(t, env, "guarded", v1alpha1.ReasonSwapMismatch)
	if c := meta.FindStatusCondition(g.Status.Conditions, string(v1alpha1.ConditionInSync)); !strings.Contains(c.Message, other.CID) {
		t.Fatalf("condition %q does not name the CID the repo holds (%s)", c.Message, other.CID)
	}
	if got, _ := user.GetRecord(ctx, "", noteCollection, "guarded"); got == nil || got.CID != other.CID {
		t.Fatalf("the guarded record was overwritten: %+v", got)
	}

	// Retain keeps the record; Delete deletes it, and the watch lists it as deleted.
	// A merge patch: the controller writes this object too, so an Update of a copy read
	// earlier may meet a newer resourceVersion.
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"deletionPolicy":"Retain"}}`))
	if err := env.Client.Patch(ctx, rec, patch); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, env, "hello", v1alpha1.ReasonInSync) // the new generation is seen; the record itself is unchanged
	if err := env.Client.Delete(ctx, rec); err != nil {
		t.Fatal(err)
	}
	newRecord(t, env, "gone", "ref", noteCollection, "gone", note("bye"))
	gone := waitRecord(t, env, "gone", v1alpha1.ReasonWritten)
	if err := env.Client.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	waitWatch(t, env, "notes", "the deleted record", func(st v1alpha1.AtprotoRecordWatchStatus) bool {
		return wasDeleted(st, gone.Status.URI)
	})
	testenv.Eventually(t, 20*time.Second, "retained record still there", func() (bool, error) {
		err := env.Client.Get(ctx, key("hello"), &v1alpha1.AtprotoRecord{})
		if err == nil {
			return false, nil
		}
		_, gerr := user.GetRecord(ctx, "", noteCollection, "hello")
		return gerr == nil, gerr
	})
}
