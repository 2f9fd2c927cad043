package nodeclaim_test

// Publishing a cluster's Infra (publishInfra) against the real core and the real embedded
// PDS: the NodeClaim, Infra, AtprotoRecord and AtprotoRecordWatch controllers run; the
// ComputeContracts' status is driven from the test, as the market and the guest set it.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/controllers/atprotorecord"
	"socialweb.computer/internal/controllers/atprotorecordwatch"
	infractl "socialweb.computer/internal/controllers/infra"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
	"socialweb.computer/internal/watch"
)

type pubRig struct {
	*rig
	owner string
	logs  *testenv.LogBuffer
}

// newPubRig starts the core with the embedded PDS (its default account owns the clusters)
// and the controllers a published cluster Infra needs.
func newPubRig(t *testing.T) *pubRig {
	env := testenv.Start(t, testenv.Options{PDS: true})
	r := &pubRig{rig: &rig{t: t, env: env, c: env.Client, root: t.TempDir()}, owner: env.Account.DID, logs: &testenv.LogBuffer{}}
	log := slog.New(slog.NewTextHandler(r.logs, nil))
	m, err := ctrlmanager.New(env.Config, ctrlmanager.Options{SkipNameValidation: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	res, broker := &repos.Resolver{PDS: env.PDS, Client: m.GetClient()}, &watch.Broker{}
	if err := infractl.Setup(m, res, broker, log, nil); err != nil {
		t.Fatal(err)
	}
	if err := atprotorecord.Setup(m, res, broker, quiet(), nil); err != nil {
		t.Fatal(err)
	}
	if err := atprotorecordwatch.Setup(m, res, broker, quiet(), nil); err != nil {
		t.Fatal(err)
	}
	if err := nodeclaim.Setup(m, nodeclaim.Options{Bundler: pkiBundler{r.root}, Nodes: &r.nodes, Log: log}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = m.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	return r
}

func (r *pubRig) ownedCluster(name string) *v1alpha1.Cluster {
	r.t.Helper()
	c := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: name},
		Spec: v1alpha1.ClusterSpec{Account: r.owner, Name: name, MaxNodes: 4}}
	if err := r.c.Create(context.Background(), c); err != nil {
		r.t.Fatal(err)
	}
	if _, err := tenant.EnsurePKI(tenant.LayoutFor(r.root, home, name).PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil); err != nil {
		r.t.Fatal(err)
	}
	return c
}

// setPublish sets spec.publishInfra, as the gateway's setPublishInfra does for the owner.
func (r *pubRig) setPublish(cluster string, publish bool) {
	r.t.Helper()
	var c v1alpha1.Cluster
	r.get(types.NamespacedName{Namespace: home, Name: cluster}, &c)
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.PublishInfra = publish
	if err := r.c.Patch(context.Background(), &c, patch); err != nil {
		r.t.Fatal(err)
	}
}

// record reads the cluster Infra's record from the owner's repo: the value, its raw JSON
// and cid; nil when there is none.
func (r *pubRig) record(rkey string) (*atinfra.Infra, string, string) {
	r.t.Helper()
	rec, err := r.env.PDS.Repo(r.owner).Get(context.Background(), atinfra.InfraNSID, rkey)
	if err != nil {
		return nil, "", ""
	}
	var v atinfra.Infra
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		r.t.Fatalf("record %s: %v (%s)", rkey, err, rec.Value)
	}
	return &v, string(rec.Value), rec.CID
}

// listRecords counts the infra records of the owner's repo, the index at self aside.
func (r *pubRig) listRecords() int {
	r.t.Helper()
	recs, _, err := r.env.PDS.Repo(r.owner).List(context.Background(), atinfra.InfraNSID, 100, "", false)
	if err != nil {
		r.t.Fatal(err)
	}
	n := 0
	for _, rec := range recs {
		if !strings.HasSuffix(rec.URI, "/"+infra.RkeySelf) { // the account's index
			n++
		}
	}
	return n
}

func (r *pubRig) putRecord(rkey string, v atinfra.Infra) string {
	r.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		r.t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		r.t.Fatal(err)
	}
	_, res, err := r.env.PDS.Repo(r.owner).Put(context.Background(), atinfra.InfraNSID, rkey, m, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return res.CID
}

func condition(inf *v1alpha1.Infra, t v1alpha1.ConditionType) string {
	c := meta.FindStatusCondition(inf.Status.Conditions, string(t))
	if c == nil {
		return "none"
	}
	return string(c.Status) + " " + c.Reason
}

// recordLeaks lists the kcp-only words a published record carries.
func recordLeaks(raw string) []string {
	var out []string
	for _, w := range []string{"nodeJoin", "ownerDid", "nodeClaimRef", "adopt", "secret", "bundle", "clusterRef", "userData",
		"policy", "sshAuthorizedKeys", "vmReadyTimeoutSec", "message", "repoRef", home, server} {
		if strings.Contains(strings.ToLower(raw), strings.ToLower(w)) {
			out = append(out, w)
		}
	}
	return out
}

func entryNames(rec *atinfra.Infra) []string {
	var out []string
	for _, c := range rec.Contracts {
		out = append(out, c.Name+"="+c.State)
	}
	slices.Sort(out)
	return out
}

// ACC31-REC9-DEFAULT-OFF, -PUBLISH, -EDIT-OVERWRITTEN and -OPT-OUT-KEEPS, in order, on one
// cluster with one node Held by a winner.
func TestNodeClaims_REC9_PublishEditOptOut(t *testing.T) {
	r := newPubRig(t)
	ctx := context.Background()
	r.ownedCluster("web")
	a := r.claim("node-a", "web")
	ccA, entryA := contractOf("web", a), infra.NodeEntryName(string(a.UID))
	r.eventually("ComputeContract of a", func() (bool, string) { _, ok := r.contract(ccA); return ok, "absent" })
	r.drive(ccA, v1alpha1.ComputeContractHeld, true)
	r.eventually("the Infra Deployed", func() (bool, string) {
		got, _ := r.infraOf("web")
		return got.Status.Phase == v1alpha1.InfraDeployed, string(got.Status.Phase)
	})
	inf, _ := r.infraOf("web")
	rkey := inf.Name

	// DEFAULT-OFF: no binding, no record, no owner repo made.
	if inf.Spec.Record != nil {
		t.Fatalf("DEFAULT-OFF: the Infra of a cluster that did not opt in is bound: %+v", inf.Spec.Record)
	}
	if n := r.listRecords(); n != 0 {
		t.Fatalf("DEFAULT-OFF: the owner's repo holds %d infra records", n)
	}
	ownerRepo := types.NamespacedName{Namespace: gateway, Name: infra.OwnerRepoName(r.owner)}
	var repo v1alpha1.AtprotoRepo
	if r.get(ownerRepo, &repo) {
		t.Fatalf("DEFAULT-OFF: the owner's AtprotoRepo exists before any opt-in")
	}

	// PUBLISH: the binding, the owner's repo, Synced True, the record of the node entry.
	r.setPublish("web", true)
	r.eventually("PUBLISH: bound and Synced True", func() (bool, string) {
		got, _ := r.infraOf("web")
		return got.Spec.Record != nil && condition(got, v1alpha1.ConditionSynced) == "True "+infra.ReasonSyncInSync,
			fmt.Sprintf("record %+v synced %s", got.Spec.Record, condition(got, v1alpha1.ConditionSynced))
	})
	inf, _ = r.infraOf("web")
	if want := (v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: ownerRepo.Name}, Sync: v1alpha1.RecordSyncPublish}); !equality.Semantic.DeepEqual(*inf.Spec.Record, want) {
		t.Fatalf("PUBLISH: binding %+v, want %+v", *inf.Spec.Record, want)
	}
	if !r.get(ownerRepo, &repo) || repo.Spec.Local == nil || repo.Spec.Local.Account != r.owner {
		t.Fatalf("PUBLISH: owner repo %+v", repo.Spec)
	}
	if want := fmt.Sprintf("at://%s/%s/%s", r.owner, atinfra.InfraNSID, rkey); inf.Status.Record == nil || inf.Status.Record.URI != want {
		t.Fatalf("PUBLISH: status.record %+v, want uri %s", inf.Status.Record, want)
	}
	var rec *atinfra.Infra
	var raw string
	r.eventually("PUBLISH: the record shows the entry requested and deployed with the winner", func() (bool, string) {
		rec, raw, _ = r.record(rkey)
		if rec == nil || rec.Status == nil || len(rec.Status.Contracts) != 1 {
			return false, raw
		}
		st := rec.Status.Contracts[0]
		return len(rec.Contracts) == 1 && rec.Contracts[0].Name == entryA && rec.Contracts[0].State == "requested" &&
			rec.Contracts[0].VMName != nil && *rec.Contracts[0].VMName == "node-a" &&
			*rec.Status.Phase == "deployed" && st.Phase != nil && *st.Phase == "deployed" && st.Winner != nil && *st.Winner == "did:plc:winner", raw
	})
	if leaks := recordLeaks(raw); len(leaks) > 0 {
		t.Fatalf("PUBLISH: the record carries %v: %s", leaks, raw)
	}
	if cc, _ := r.contract(ccA); cc.Spec.RepoRef == nil || cc.Spec.RepoRef.Name != infra.NodeRequesterRepo {
		t.Fatalf("PUBLISH: the node contract's requester is %+v, want %s", cc.Spec.RepoRef, infra.NodeRequesterRepo)
	}

	// EDIT-OVERWRITTEN: a second entry and the first released, straight to the PDS.
	infBefore, _ := r.infraOf("web")
	claimBefore, _ := r.nodeClaim("node-a")
	edit := *rec
	edit.Contracts = []atinfra.InfraContract{{Name: entryA, State: "released"}, {Name: "node-intruder", State: "requested"}}
	edited := r.putRecord(rkey, edit)
	r.eventually("EDIT-OVERWRITTEN: the record is the projection again", func() (bool, string) {
		got, graw, gcid := r.record(rkey)
		return got != nil && gcid != edited && slices.Equal(entryNames(got), []string{entryA + "=requested"}), graw
	})
	if !strings.Contains(r.logs.String(), "infra_record_overwritten") {
		t.Fatalf("EDIT-OVERWRITTEN: no infra_record_overwritten in the log")
	}
	infAfter, _ := r.infraOf("web")
	claimAfter, _ := r.nodeClaim("node-a")
	if infAfter.Generation != infBefore.Generation || !equality.Semantic.DeepEqual(infAfter.Spec, infBefore.Spec) {
		t.Fatalf("EDIT-OVERWRITTEN: the edit changed the Infra spec: generation %d -> %d", infBefore.Generation, infAfter.Generation)
	}
	if claimAfter.Status.Phase != claimBefore.Status.Phase || claimAfter.Generation != claimBefore.Generation {
		t.Fatalf("EDIT-OVERWRITTEN: the claim moved: %s -> %s", claimBefore.Status.Phase, claimAfter.Status.Phase)
	}
	if cc, _ := r.contract(ccA); cc.Spec.Release != nil {
		t.Fatalf("EDIT-OVERWRITTEN: the node's contract was released")
	}
	var ccs v1alpha1.ComputeContractList
	if err := r.c.List(ctx, &ccs, client.InNamespace(gateway)); err != nil || len(ccs.Items) != 1 {
		t.Fatalf("EDIT-OVERWRITTEN: %d ComputeContracts (%v), want 1", len(ccs.Items), err)
	}
	if _, err := r.env.PDS.Repo(r.owner).Delete(ctx, atinfra.InfraNSID, rkey, nil); err != nil {
		t.Fatal(err)
	}
	r.eventually("EDIT-OVERWRITTEN: the deleted record is written again", func() (bool, string) {
		got, graw, _ := r.record(rkey)
		return got != nil && slices.Equal(entryNames(got), []string{entryA + "=requested"}), graw
	})
	if got, ok := r.infraOf("web"); !ok || !got.DeletionTimestamp.IsZero() {
		t.Fatalf("EDIT-OVERWRITTEN: the Infra went with its record")
	}

	// OPT-OUT-KEEPS: unbound, the child gone, Retained and Synced False Unbound, still
	// Deployed, the record kept.
	_, _, cidBefore := r.record(rkey)
	r.setPublish("web", false)
	child := types.NamespacedName{Namespace: gateway, Name: infra.RecordChildName(infra.KindInfra, rkey)}
	r.eventually("OPT-OUT-KEEPS: unbound and retained", func() (bool, string) {
		got, _ := r.infraOf("web")
		var ch v1alpha1.AtprotoRecord
		hasChild := r.get(child, &ch)
		dir := v1alpha1.RecordSyncDirection("")
		if got.Status.Record != nil {
			dir = got.Status.Record.Direction
		}
		return got.Spec.Record == nil && !hasChild && dir == v1alpha1.RecordRetained &&
				condition(got, v1alpha1.ConditionSynced) == "False "+infra.ReasonSyncUnbound && got.Status.Phase == v1alpha1.InfraDeployed,
			fmt.Sprintf("record %+v child %v direction %s synced %s phase %s", got.Spec.Record, hasChild, dir, condition(got, v1alpha1.ConditionSynced), got.Status.Phase)
	})
	if got, _, gcid := r.record(rkey); got == nil || gcid != cidBefore {
		t.Fatalf("OPT-OUT-KEEPS: the record after opting out: %v cid %s, want it kept at %s", got != nil, gcid, cidBefore)
	}
	// Opting in again rebinds to the same record and pushes.
	r.setPublish("web", true)
	r.eventually("OPT-OUT-KEEPS: opted in again, in sync at the same uri", func() (bool, string) {
		got, _ := r.infraOf("web")
		uri := ""
		if got.Status.Record != nil {
			uri = got.Status.Record.URI
		}
		return got.Spec.Record != nil && condition(got, v1alpha1.ConditionSynced) == "True "+infra.ReasonSyncInSync &&
			uri == fmt.Sprintf("at://%s/%s/%s", r.owner, atinfra.InfraNSID, rkey), condition(got, v1alpha1.ConditionSynced) + " " + uri
	})
	if n := r.listRecords(); n != 1 {
		t.Fatalf("OPT-OUT-KEEPS: %d infra records after opting in again, want the one", n)
	}
}

// ACC31-REC9-SCALE-IN-RECORD: a cluster opted in at two nodes scales in to one: the record
// shows only the remaining entry, still deployed; the last node leaving deletes the Infra and
// its record. A new node publishes at the same key again.
func TestNodeClaims_REC9_ScaleInRecord(t *testing.T) {
	r := newPubRig(t)
	ctx := context.Background()
	r.ownedCluster("web")
	r.setPublish("web", true)
	a, b := r.claim("node-a", "web"), r.claim("node-b", "web")
	ccA, ccB := contractOf("web", a), contractOf("web", b)
	entryA, entryB := infra.NodeEntryName(string(a.UID)), infra.NodeEntryName(string(b.UID))
	for _, n := range []string{ccA, ccB} {
		r.eventually("ComputeContract "+n, func() (bool, string) { _, ok := r.contract(n); return ok, "absent" })
		r.drive(n, v1alpha1.ComputeContractHeld, true)
	}
	inf, _ := r.infraOf("web")
	rkey := inf.Name
	r.eventually("the record shows two deployed entries", func() (bool, string) {
		got, raw, _ := r.record(rkey)
		return got != nil && got.Status != nil && *got.Status.Phase == "deployed" &&
			slices.Equal(entryNames(got), sortedOf(entryA+"=requested", entryB+"=requested")), raw
	})

	if err := r.c.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	r.eventually("a's entry released in the record", func() (bool, string) {
		got, raw, _ := r.record(rkey)
		return got != nil && slices.Equal(entryNames(got), sortedOf(entryA+"=released", entryB+"=requested")), raw
	})
	r.drive(ccA, v1alpha1.ComputeContractReleased, false)
	r.eventually("the record holds only b, still deployed", func() (bool, string) {
		got, raw, _ := r.record(rkey)
		return got != nil && got.Status != nil && *got.Status.Phase == "deployed" &&
			slices.Equal(entryNames(got), []string{entryB + "=requested"}), raw
	})
	if _, raw, _ := r.record(rkey); len(recordLeaks(raw)) > 0 {
		t.Fatalf("the record carries %v: %s", recordLeaks(raw), raw)
	}

	if err := r.c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	r.eventually("b's contract released", func() (bool, string) {
		cc, ok := r.contract(ccB)
		return ok && cc.Spec.Release != nil, "not released"
	})
	r.drive(ccB, v1alpha1.ComputeContractReleased, false)
	r.eventually("the Infra, its claims and its record child gone", func() (bool, string) {
		_, hasInfra := r.infraOf("web")
		_, hasClaim := r.nodeClaim("node-b")
		var ch v1alpha1.AtprotoRecord
		hasChild := r.get(types.NamespacedName{Namespace: gateway, Name: infra.RecordChildName(infra.KindInfra, rkey)}, &ch)
		return !hasInfra && !hasClaim && !hasChild, fmt.Sprintf("infra %v claim %v child %v", hasInfra, hasClaim, hasChild)
	})
	if got, raw, _ := r.record(rkey); got != nil {
		t.Fatalf("the record after the last node: %s, want none", raw)
	}
	if n := r.listRecords(); n != 0 {
		t.Fatalf("%d infra records left in the owner's repo", n)
	}

	// Scaling from zero again publishes at the same key: nothing accumulates.
	c := r.claim("node-c", "web")
	ccC := contractOf("web", c)
	r.eventually("ComputeContract of c", func() (bool, string) { _, ok := r.contract(ccC); return ok, "absent" })
	r.drive(ccC, v1alpha1.ComputeContractHeld, true)
	r.eventually("the record again at the same key", func() (bool, string) {
		got, raw, _ := r.record(rkey)
		return got != nil && slices.Equal(entryNames(got), []string{infra.NodeEntryName(string(c.UID)) + "=requested"}), raw
	})
}

func sortedOf(s ...string) []string {
	slices.Sort(s)
	return s
}

// An owner whose account is not on the embedded PDS: opting in binds the Infra and makes the
// owner's repo, which never connects; the Infra reports Synced False RecordUnavailable, nothing
// is published, and the node goes on as if the cluster had not opted in.
func TestNodeClaims_REC9_OwnerElsewherePublishesNothing(t *testing.T) {
	r := newPubRig(t)
	const elsewhere = "did:plc:ownerelsewhere"
	c := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: "web"},
		Spec: v1alpha1.ClusterSpec{Account: elsewhere, Name: "web", MaxNodes: 4, PublishInfra: true}}
	if err := r.c.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if _, err := tenant.EnsurePKI(tenant.LayoutFor(r.root, home, "web").PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil); err != nil {
		t.Fatal(err)
	}
	a := r.claim("node-a", "web")
	ccA := contractOf("web", a)
	r.eventually("ComputeContract of a", func() (bool, string) { _, ok := r.contract(ccA); return ok, "absent" })
	r.drive(ccA, v1alpha1.ComputeContractHeld, true)
	r.eventually("Deployed, bound, the record unavailable", func() (bool, string) {
		got, _ := r.infraOf("web")
		return got.Status.Phase == v1alpha1.InfraDeployed && got.Spec.Record != nil &&
				condition(got, v1alpha1.ConditionSynced) == "False "+infra.ReasonSyncUnavailable,
			fmt.Sprintf("%s record %+v synced %s", got.Status.Phase, got.Spec.Record, condition(got, v1alpha1.ConditionSynced))
	})
	var repo v1alpha1.AtprotoRepo
	if !r.get(types.NamespacedName{Namespace: gateway, Name: infra.OwnerRepoName(elsewhere)}, &repo) || repo.Spec.Local == nil || repo.Spec.Local.Account != elsewhere {
		t.Fatalf("owner repo %+v", repo.Spec)
	}
	r.eventually("the claim Joining", func() (bool, string) {
		got, _ := r.nodeClaim("node-a")
		return got.Status.Phase == v1alpha1.NodeClaimJoining, string(got.Status.Phase)
	})
	if n := r.listRecords(); n != 0 {
		t.Errorf("%d records in the local account's repo", n)
	}
}
