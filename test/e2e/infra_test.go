package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/testenv"
)

// ACC29 STAGED-NO-RFP: staged contracts create no ComputeContract (so no RFP); the record
// says staged.
func TestACC29_StagedNoRFP(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	newInfra(t, env, "web", "two staged", []string{"api", "db"})
	inf := waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	if inf.Status.Phase != v1alpha1.InfraStaged || inf.Status.ContractsReady != "0/0" {
		t.Fatalf("phase %s contracts %s, want Staged 0/0", inf.Status.Phase, inf.Status.ContractsReady)
	}
	// kubectl says the two contracts are staged, not "0/0" alone.
	if row := infraRow(t, env, "web"); len(row) < 6 || !slices.Equal(row[1:6], []string{"Staged", "0/0", "2", "Staged", "True"}) {
		t.Errorf("kubectl get infra web: %q, want PHASE Staged, READY 0/0, CONTRACTS 2 Staged, no winner, SYNCED True", row)
	}
	wantURI := "at://" + env.Account.DID + "/" + infraNSID + "/web"
	if inf.Status.Record.URI != wantURI {
		t.Fatalf("uri %s, want %s", inf.Status.Record.URI, wantURI)
	}
	var ccs v1alpha1.ComputeContractList
	if err := env.Client.List(ctx, &ccs); err != nil || len(ccs.Items) != 0 {
		t.Fatalf("ComputeContracts %v (%v), want none", ccs.Items, err)
	}
	rec, cid := pdsInfra(t, env, "web")
	if rec == nil || cid != inf.Status.Record.CID {
		t.Fatalf("record %+v cid %s, want cid %s", rec, cid, inf.Status.Record.CID)
	}
	for _, c := range rec.Contracts {
		if c.State != "staged" {
			t.Fatalf("record contract %s is %s, want staged", c.Name, c.State)
		}
	}
	if rec.Status == nil || rec.Status.Phase == nil || *rec.Status.Phase != "staged" || *rec.Description != "two staged" {
		t.Fatalf("record status %s, want phase staged", statusJSON(rec))
	}
	if !slices.Contains(inf.Finalizers, v1alpha1.FinalizerInfraRelease) {
		t.Fatalf("finalizers %v lack %s", inf.Finalizers, v1alpha1.FinalizerInfraRelease)
	}
}

// ACC29 RECORD-EDIT-PULL: a putRecord straight to the PDS changes the description and adds a
// contract; the object follows, direction Pulled.
func TestACC29_RecordEditPull(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	localRepo(t, env, "me")
	newInfra(t, env, "web", "before", []string{"api"})
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	rec, _ := pdsInfra(t, env, "web")

	rec.Description = strp("edited on the PDS")
	rec.Contracts = append(rec.Contracts, atinfra.InfraContract{Name: "worker", State: "staged"})
	cid := putInfra(t, env, "web", *rec)
	inf := waitInfra(t, env, "web", "pulled", func(got *v1alpha1.Infra) bool {
		return inSync(v1alpha1.RecordPulled)(got) && got.Spec.Description == "edited on the PDS"
	})
	if got := contractNames(inf.Spec.Contracts); !slices.Equal(got, []string{"api", "worker"}) {
		t.Fatalf("contracts %v, want api, worker", got)
	}
	if inf.Status.Record.CID == "" || inf.Status.Record.URI == "" || cid == "" {
		t.Fatalf("record status %+v", inf.Status.Record)
	}
	// The record carries the new contract's status once the object observed it.
	testenv.Eventually(t, 30*time.Second, "the record reports the pulled contract", func() (bool, error) {
		r, _ := pdsInfra(t, env, "web")
		return r != nil && r.Status != nil && len(r.Status.Contracts) == 2, nil
	})
}

// ACC29 KCP-EDIT-PUSH: an edit of the object is written to the record, direction InSync
// after the push landed.
func TestACC29_KcpEditPush(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	localRepo(t, env, "me")
	newInfra(t, env, "web", "before", []string{"api"})
	inf := waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))
	first := inf.Status.Record.CID

	editInfra(t, env, "web", func(i *v1alpha1.Infra) {
		i.Spec.Description = "edited in kcp"
		i.Spec.Contracts = append(i.Spec.Contracts, v1alpha1.InfraContract{Name: "cache"})
	})
	inf = waitInfra(t, env, "web", "pushed and in sync", func(got *v1alpha1.Infra) bool {
		return inSync(v1alpha1.RecordInSync)(got) && got.Status.Record.CID != first
	})
	rec, cid := pdsInfra(t, env, "web")
	if *rec.Description != "edited in kcp" || !slices.Equal(recordContractNames(rec.Contracts), []string{"api", "cache"}) || cid != inf.Status.Record.CID {
		t.Fatalf("record %s (cid %s), want the kcp edit at cid %s", statusJSON(rec), cid, inf.Status.Record.CID)
	}
	if condIs(inf, v1alpha1.ConditionSyncConflict, metav1.ConditionTrue, "") {
		t.Fatal("a push reported a conflict")
	}
}

// ACC29 CONFLICT: record access is cut, both sides edit, access comes back: the record
// wins, SyncConflict True RecordWon naming the losing generation and the winning cid.
func TestACC29_Conflict(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	repo := localRepo(t, env, "me")
	newInfra(t, env, "web", "agreed", []string{"api"})
	waitInfra(t, env, "web", "in sync", inSync(v1alpha1.RecordInSync))

	// Cut: the AtprotoRepo names an account the PDS does not have.
	repo.Spec.Local.Account = "nobody.test"
	if err := env.Client.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	rec, _ := pdsInfra(t, env, "web")
	// kcp side.
	editInfra(t, env, "web", func(i *v1alpha1.Infra) { i.Spec.Description = "kcp side" })
	inf := waitInfra(t, env, "web", "record unavailable", func(got *v1alpha1.Infra) bool {
		return got.Status.ObservedGeneration == got.Generation && condIs(got, v1alpha1.ConditionSynced, metav1.ConditionFalse, "RecordUnavailable")
	})
	losing := inf.Generation
	// Record side.
	rec.Description = strp("record side")
	winning := putInfra(t, env, "web", *rec)

	// Restore.
	if err := env.Client.Get(ctx, key("me"), repo); err != nil {
		t.Fatal(err)
	}
	repo.Spec.Local.Account = env.Account.Handle
	if err := env.Client.Update(ctx, repo); err != nil {
		t.Fatal(err)
	}
	inf = waitInfra(t, env, "web", "record won", func(got *v1alpha1.Infra) bool {
		return got.Spec.Description == "record side" && condIs(got, v1alpha1.ConditionSyncConflict, metav1.ConditionTrue, string(v1alpha1.ReasonRecordWon))
	})
	c := condMessage(inf, v1alpha1.ConditionSyncConflict)
	if !strings.Contains(c, winning) || !strings.Contains(c, itoa(losing)) {
		t.Fatalf("SyncConflict message %q should name generation %d and cid %s", c, losing, winning)
	}
	waitInfra(t, env, "web", "in sync after the conflict", inSync(v1alpha1.RecordPulled))
	got, _ := pdsInfra(t, env, "web")
	if *got.Description != "record side" {
		t.Fatalf("record description %q, want the record's", *got.Description)
	}
}
