package atprotorecordwatch

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/config/crd"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/logsink"
)

// startCore starts the embedded API server (internal/testenv would import this package).
func startCore(t *testing.T) client.Client {
	t.Helper()
	dir, err := core.OpenDataDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	logsink.KlogTo(io.Discard)
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := core.Start(ctx, core.Config{Dir: dir, CRDs: crds, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	cl, err := client.New(c.RESTConfig, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// A watch whose status was checkpointed by merge patch, before apply: when the last record
// of the collection goes, the follower's checkpoint removes status.records.
func TestCheckpointRemovesRecordsOfMergePatchedStatus(t *testing.T) {
	cl := startCore(t)
	ctx := context.Background()
	w := &v1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w"},
		Spec: v1alpha1.AtprotoRecordWatchSpec{RepoRef: v1alpha1.ObjectRef{Name: "repo"}, Collection: "com.example.note"}}
	if err := cl.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFromWithOptions(w.DeepCopy(), client.MergeFromWithOptimisticLock{})
	w.Status = v1alpha1.AtprotoRecordWatchStatus{ObservedGeneration: w.Generation, Cursor: 5,
		Records: []v1alpha1.WatchedRecord{{URI: "at://did:plc:me/com.example.note/a", CID: "c1"}}}
	meta.SetStatusCondition(&w.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionTrue, Reason: ReasonFollowing, Message: "following"})
	if err := cl.Status().Patch(ctx, w, patch); err != nil {
		t.Fatal(err)
	}

	st := stateFromStatus(w.Status)
	st.cursor = 6
	st.deleted = append(st.deleted, v1alpha1.WatchedRecord{URI: "at://did:plc:me/com.example.note/a", CID: "c1"})
	delete(st.records, "at://did:plc:me/com.example.note/a")
	f := &follower{r: &Reconciler{Client: cl, Reader: cl}, name: client.ObjectKeyFromObject(w),
		key: followKey{generation: w.Generation}, obj: w, st: st}
	if err := f.checkpoint(ctx, metav1.ConditionTrue, ReasonFollowing, ""); err != nil {
		t.Fatal(err)
	}

	var got v1alpha1.AtprotoRecordWatch
	if err := cl.Get(ctx, client.ObjectKeyFromObject(w), &got); err != nil {
		t.Fatal(err)
	}
	ready := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
	if len(got.Status.Records) != 0 || len(got.Status.Deleted) != 1 || got.Status.Cursor != 6 || ready == nil || ready.Message != "following" {
		t.Fatalf("status %+v: want no records, one deleted, cursor 6 and Ready kept", got.Status)
	}
	if f.obj.Status.Cursor != 6 || f.obj.ResourceVersion != got.ResourceVersion {
		t.Fatalf("the follower's object %+v is not the one written", f.obj)
	}
}
