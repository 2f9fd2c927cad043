package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/cluster"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// getJob over XRPC reads a Job's logs from the node it ran on: a cluster made through the
// gateway scales up to one node for the Job applied through the gateway, and getJob answers
// the Job Succeeded with its container's output, cut to tailLines. The cluster opted in to
// publishing (setPublishInfra), so the owner's repo shows the node entry deployed with the
// node bidder as winner while it runs, nothing kcp-only, and the record goes with the cluster's
// node Infra.
func TestGateway_GetJobLogsFromANode(t *testing.T) {
	t.Parallel()
	// A long hold: the node goes 3 s after the Job's pod ends with a short one, and under load
	// the Job's Succeeded can come later than that, its log gone with the node.
	g := startGatewayNode(t, "j1", holdFor(time.Minute))
	a, acct, pa, nodeBidder := g.caller, g.acct, g.pds, g.nodeBidder
	ctx := context.Background()
	a.must(cluster.SetPublishInfraNSID, map[string]any{"name": "j1", "publish": true}, nil)
	rkey := infra.ClusterInfraName(gateway.AccountNamespace(acct.DID), "j1")
	record := func() (*atinfra.Infra, string) {
		rec, err := pa.GetRecord(ctx, acct.DID, atinfra.InfraNSID, rkey)
		if err != nil {
			return nil, ""
		}
		var v atinfra.Infra
		if err := json.Unmarshal(rec.Value, &v); err != nil {
			t.Fatalf("record: %v (%s)", err, rec.Value)
		}
		return &v, string(rec.Value)
	}
	var deployed string // the record as seen while the node was deployed

	job := `{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"count"},"spec":{"backoffLimit":0,"template":{"spec":{
		"restartPolicy":"Never","automountServiceAccountToken":false,"containers":[{"name":"c","image":"` + node.BusyboxImage + `",
		"imagePullPolicy":"Never","command":["/bin/sh","-c","for i in 1 2 3 4 5; do echo line $i; done"]}]}}}}`
	t0 := time.Now()
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "j1", "manifest": json.RawMessage(job)}, nil)
	var out cluster.GetJobOutput
	testenv.Eventually(t, 180*time.Second, "getJob Succeeded with its log", func() (bool, error) {
		if rec, raw := record(); deployed == "" && rec != nil && rec.Status != nil && rec.Status.Phase != nil && *rec.Status.Phase == "deployed" &&
			len(rec.Status.Contracts) == 1 && rec.Status.Contracts[0].Winner != nil && *rec.Status.Contracts[0].Winner == nodeBidder {
			deployed = raw
		}
		a.must(cluster.GetJobNSID+"?cluster=j1&namespace=default&name=count&tailLines=2", nil, &out)
		if out.Phase == "Failed" {
			t.Fatalf("the Job failed: %+v", out)
		}
		return out.Phase == "Succeeded", fmt.Errorf("%s %+v", out.Phase, out.Pods)
	})
	t.Logf("apply -> getJob Succeeded in %.2fs (a node scaled up for it)", time.Since(t0).Seconds())
	if len(out.Pods) != 1 || len(out.Pods[0].Containers) != 1 || out.Pods[0].Containers[0].Log == nil {
		t.Fatalf("getJob pods %+v", out.Pods)
	}
	if got := *out.Pods[0].Containers[0].Log; got != "line 4\nline 5\n" {
		t.Errorf("log with tailLines=2: %q", got)
	}
	a.must(cluster.GetJobNSID+"?cluster=j1&namespace=default&name=count", nil, &out)
	if got := *out.Pods[0].Containers[0].Log; strings.Count(got, "line ") != 5 {
		t.Errorf("log with the default tailLines: %q", got)
	}
	testenv.Eventually(t, 30*time.Second, "the published record seen deployed", func() (bool, error) {
		if rec, raw := record(); deployed == "" && rec != nil && rec.Status != nil && rec.Status.Phase != nil && *rec.Status.Phase == "deployed" {
			deployed = raw
		}
		return deployed != "", nil
	})
	var rec atinfra.Infra
	_ = json.Unmarshal([]byte(deployed), &rec)
	if len(rec.Contracts) != 1 || rec.Contracts[0].State != "requested" || rec.Contracts[0].ComputeKind == nil || *rec.Contracts[0].ComputeKind != "node" ||
		rec.Contracts[0].VMName == nil || *rec.Contracts[0].VMName == "" {
		t.Errorf("the published node entry: %s", deployed)
	}
	for _, w := range []string{"nodeJoin", "ownerDid", "nodeClaimRef", "secret", "bundle", "clusterRef", "userData", "policy", "repoRef", "127.0.0.1"} {
		if strings.Contains(strings.ToLower(deployed), strings.ToLower(w)) {
			t.Errorf("the published record carries %q: %s", w, deployed)
		}
	}
	a.must(cluster.DeleteClusterNSID, map[string]string{"name": "j1"}, nil)
	testenv.Eventually(t, 90*time.Second, "j1 gone", func() (bool, error) {
		_, ok := a.list()["j1"]
		return !ok, nil
	})
	testenv.Eventually(t, 60*time.Second, "the record gone with the cluster's Infra", func() (bool, error) {
		rec, raw := record()
		return rec == nil, fmt.Errorf("%s", raw)
	})
}

// gatewayNode is `up` with its node bidder and a busybox image, its local account logged in,
// and a cluster made through the gateway, Ready at zero nodes.
type gatewayNode struct {
	dir        string // up's data dir
	caller     *gwCaller
	acct       app.LocalAccount
	pds        *atclient.Client
	nodeBidder string
}

// startGatewayNode starts it with the cluster's scaling fields (scaleHold, maxNodes,
// podsPerNode) set by sizing: no method sets them yet, so they are patched in the core.
func startGatewayNode(t *testing.T, name string, sizing func(*v1alpha1.ClusterSpec)) *gatewayNode {
	t.Helper()
	requireNodeHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	state := filepath.Join(dir, "node-bidder", "guests")
	t.Cleanup(func() {
		s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin})
		if err != nil {
			t.Error(err)
			return
		}
		substratetest.Cleanup(t, s, state)
	})
	up := startUp(t, dir)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("what up logged about claims, the node host and the node bidder:\n%s", (&nodeUp{dir: dir}).dump())
		}
	})
	gwURL, pdsURL := up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	nodeBidder := up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, acct, pa := ownerCaller(t, up, pdsURL, gwURL, aud)

	a.must(cluster.CreateClusterNSID, map[string]string{"name": name}, nil)
	c := coreClient(t, dir)
	var cl v1alpha1.Cluster
	key := client.ObjectKey{Namespace: gateway.AccountNamespace(acct.DID), Name: name}
	if err := c.Get(ctx, key, &cl); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cl.DeepCopy())
	sizing(&cl.Spec)
	if err := c.Patch(ctx, &cl, patch); err != nil {
		t.Fatal(err)
	}
	a.waitPhase(name, "Ready", 90*time.Second)
	return &gatewayNode{dir: dir, caller: a, acct: acct, pds: pa, nodeBidder: nodeBidder}
}

// holdFor sizes a cluster by its scaleHold alone.
func holdFor(hold time.Duration) func(*v1alpha1.ClusterSpec) {
	return func(s *v1alpha1.ClusterSpec) { s.ScaleHold = metav1.Duration{Duration: hold} }
}

// TestBench_GatewayApplyToJobSucceeded prints the median time from kubectlApplyServerSide of
// a Job to getJob answering Succeeded, on a cluster whose node is warm: a first Job rents the
// node (its time is printed apart), the cluster's hold keeps it, and five more Jobs run on
// it. getJob is asked every 100 ms. SOCIALWEB_BENCH=1 runs it.
func TestBench_GatewayApplyToJobSucceeded(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	g := startGatewayNode(t, "bench", holdFor(10*time.Minute))
	run := func(name string) time.Duration {
		job := `{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"` + name + `"},"spec":{"backoffLimit":0,"template":{"spec":{
			"restartPolicy":"Never","automountServiceAccountToken":false,"containers":[{"name":"c","image":"` + node.BusyboxImage + `",
			"imagePullPolicy":"Never","command":["/bin/sh","-c","echo done"]}]}}}}`
		t0 := time.Now()
		g.caller.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "bench", "manifest": json.RawMessage(job)}, nil)
		for {
			var out cluster.GetJobOutput
			g.caller.must(cluster.GetJobNSID+"?cluster=bench&namespace=default&name="+name, nil, &out)
			switch {
			case out.Phase == "Succeeded":
				return time.Since(t0)
			case out.Phase == "Failed":
				t.Fatalf("Job %s failed: %+v", name, out)
			case time.Since(t0) > 3*time.Minute:
				t.Fatalf("Job %s not Succeeded after 3 min: %+v", name, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	cold := run("cold")
	var warm []time.Duration
	for i := 0; i < 5; i++ {
		warm = append(warm, run(fmt.Sprintf("warm-%d", i)))
	}
	sorted := slices.Clone(warm)
	slices.Sort(sorted)
	t.Logf("kubectlApplyServerSide of a Job -> getJob Succeeded: warm node median %s (runs %v); first Job, renting the node, %s",
		sorted[len(sorted)/2].Round(time.Millisecond), warm, cold.Round(time.Millisecond))
}

// The REC9 rows on a node rented through the market: a cluster that did not opt in publishes
// nothing; opting in publishes the node entry, deployed; an owner's edit (a second entry, the
// first released) changes nothing in the cluster and is written back, and so is a deleted
// record; opting out keeps the record (Retained, Synced False Unbound) and opting in again
// pushes it; a second pod that may not share the node scales the cluster to two nodes, both
// entries published, and deleting the first pod scales in to one: the record keeps only the
// remaining entry, still deployed; scaling to zero takes the record with the Infra, and no
// guest is left.
func TestACC31_REC9_OnAMarketNode(t *testing.T) {
	t.Parallel()
	g := startGatewayNode(t, "r9", func(s *v1alpha1.ClusterSpec) {
		s.ScaleHold, s.MaxNodes, s.PodsPerNode = metav1.Duration{Duration: 3 * time.Second}, 2, 1
	})
	a, acct, pa := g.caller, g.acct, g.pds
	ctx := context.Background()
	c := coreClient(t, g.dir)
	infraKey := client.ObjectKey{Namespace: nodeclaim.DefaultContractNamespace, Name: infra.ClusterInfraName(gateway.AccountNamespace(acct.DID), "r9")}
	getInfra := func() (*v1alpha1.Infra, error) {
		var inf v1alpha1.Infra
		return &inf, c.Get(ctx, infraKey, &inf)
	}
	record := func() (*atinfra.Infra, string) {
		rec, err := pa.GetRecord(ctx, acct.DID, atinfra.InfraNSID, infraKey.Name)
		if err != nil {
			return nil, ""
		}
		var v atinfra.Infra
		if err := json.Unmarshal(rec.Value, &v); err != nil {
			t.Fatalf("record: %v (%s)", err, rec.Value)
		}
		return &v, string(rec.Value)
	}
	deployedRecord := func(what string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, what, func() (bool, error) {
			rec, _ := record()
			ok := rec != nil && len(rec.Contracts) == 1 && rec.Contracts[0].State == "requested" &&
				rec.Status != nil && rec.Status.Phase != nil && *rec.Status.Phase == "deployed"
			return ok, fmt.Errorf("%+v", rec)
		})
	}

	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "r9", "manifest": spreadPodJSON(t, "keep")}, nil)
	var claimUID string
	testenv.Eventually(t, 120*time.Second, "the node's claim Running and its entry Deployed", func() (bool, error) {
		var claims v1alpha1.NodeClaimList
		if err := c.List(ctx, &claims, client.InNamespace(gateway.AccountNamespace(acct.DID))); err != nil {
			return false, err
		}
		inf, err := getInfra()
		if err != nil || len(claims.Items) != 1 {
			return false, fmt.Errorf("%d claims, infra %v", len(claims.Items), err)
		}
		claimUID = string(claims.Items[0].UID)
		return claims.Items[0].Status.Phase == v1alpha1.NodeClaimRunning && inf.Status.Phase == v1alpha1.InfraDeployed,
			fmt.Errorf("claim %s, infra %s", claims.Items[0].Status.Phase, inf.Status.Phase)
	})

	// DEFAULT-OFF
	if inf, _ := getInfra(); inf.Spec.Record != nil {
		t.Fatalf("a cluster that did not opt in has spec.record %+v", inf.Spec.Record)
	}
	if rec, _ := record(); rec != nil {
		t.Fatalf("a cluster that did not opt in published %+v", rec)
	}

	// PUBLISH
	a.must(cluster.SetPublishInfraNSID, map[string]any{"name": "r9", "publish": true}, nil)
	deployedRecord("the node entry published, deployed")
	if inf, _ := getInfra(); inf.Spec.Record == nil || inf.Spec.Record.Sync != v1alpha1.RecordSyncPublish {
		t.Fatalf("spec.record %+v, want sync Publish", inf.Spec.Record)
	}

	// EDIT-OVERWRITTEN: a second entry, the first released.
	rec, _ := record()
	rec.Contracts[0].State = "released"
	rec.Contracts = append(rec.Contracts, rec.Contracts[0])
	rec.Contracts[1].Name = "intruder"
	if _, err := pa.PutRecord(ctx, atinfra.InfraNSID, infraKey.Name, rec, nil); err != nil {
		t.Fatal(err)
	}
	deployedRecord("the owner's edit written back")
	if inf, _ := getInfra(); len(inf.Spec.Contracts) != 1 || inf.Spec.Contracts[0].State != v1alpha1.ContractRequested {
		t.Fatalf("the owner's edit reached the Infra: %+v", inf.Spec.Contracts)
	}
	if _, err := pa.DeleteRecord(ctx, atinfra.InfraNSID, infraKey.Name, nil); err != nil {
		t.Fatal(err)
	}
	deployedRecord("the deleted record written again")

	// OPT-OUT-KEEPS
	a.must(cluster.SetPublishInfraNSID, map[string]any{"name": "r9", "publish": false}, nil)
	testenv.Eventually(t, 60*time.Second, "unbound, Retained, Synced False Unbound, still Deployed", func() (bool, error) {
		inf, err := getInfra()
		if err != nil {
			return false, err
		}
		synced := meta.FindStatusCondition(inf.Status.Conditions, string(v1alpha1.ConditionSynced))
		ok := inf.Spec.Record == nil && inf.Status.Record != nil && inf.Status.Record.Direction == v1alpha1.RecordRetained &&
			synced != nil && synced.Status == metav1.ConditionFalse && synced.Reason == infra.ReasonSyncUnbound &&
			inf.Status.Phase == v1alpha1.InfraDeployed
		return ok, fmt.Errorf("record %+v status %+v synced %+v phase %s", inf.Spec.Record, inf.Status.Record, synced, inf.Status.Phase)
	})
	if rec, _ := record(); rec == nil {
		t.Fatal("opting out deleted the record")
	}
	a.must(cluster.SetPublishInfraNSID, map[string]any{"name": "r9", "publish": true}, nil)
	testenv.Eventually(t, 60*time.Second, "opted in again: Synced True", func() (bool, error) {
		inf, err := getInfra()
		if err != nil {
			return false, err
		}
		synced := meta.FindStatusCondition(inf.Status.Conditions, string(v1alpha1.ConditionSynced))
		return inf.Spec.Record != nil && synced != nil && synced.Status == metav1.ConditionTrue, fmt.Errorf("%+v", synced)
	})
	deployedRecord("the record pushed again")

	// SCALE-IN-RECORD: a second pod may not share keep's node, so the cluster rents a second
	// one and the record shows both entries; keep deleted, its node goes and the record keeps
	// only the second entry, still deployed.
	var claims v1alpha1.NodeClaimList
	if err := c.List(ctx, &claims, client.InNamespace(gateway.AccountNamespace(acct.DID))); err != nil || len(claims.Items) != 1 || string(claims.Items[0].UID) != claimUID {
		t.Fatalf("the claim changed while the record was edited: %v %+v", err, claims.Items)
	}
	first := infra.NodeEntryName(claimUID)
	var kc cluster.GetKubeconfigOutput
	a.must(cluster.GetKubeconfigNSID, map[string]any{"name": "r9", "ttlSeconds": 600}, &kc)
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, []byte(kc.Kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	tenantPods := tenantClient(t, kcPath).CoreV1().Pods("default")
	// keep must be on the first node before keep2 comes: a node that joins while both are
	// pending may take either.
	testenv.Eventually(t, 60*time.Second, "keep Running on the first node", func() (bool, error) {
		k, err := tenantPods.Get(ctx, "keep", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return k.Status.Phase == "Running" && k.Spec.NodeName == claims.Items[0].Spec.NodeName,
			fmt.Errorf("keep %s on %q, the first claim's node %q", k.Status.Phase, k.Spec.NodeName, claims.Items[0].Spec.NodeName)
	})
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "r9", "manifest": spreadPodJSON(t, "keep2")}, nil)
	var second string
	testenv.Eventually(t, 120*time.Second, "two claims Running and both entries published, deployed", func() (bool, error) {
		if err := c.List(ctx, &claims, client.InNamespace(gateway.AccountNamespace(acct.DID))); err != nil {
			return false, err
		}
		running := 0
		for _, cl := range claims.Items {
			if cl.Status.Phase == v1alpha1.NodeClaimRunning {
				running++
			}
			if string(cl.UID) != claimUID {
				second = infra.NodeEntryName(string(cl.UID))
			}
		}
		rec, _ := record()
		want := []string{first + "=requested", second + "=requested"}
		slices.Sort(want)
		ok := len(claims.Items) == 2 && running == 2 && rec != nil && slices.Equal(recordEntries(rec), want) &&
			rec.Status != nil && rec.Status.Phase != nil && *rec.Status.Phase == "deployed"
		return ok, fmt.Errorf("%d claims, %d Running, record %v", len(claims.Items), running, recordEntries(rec))
	})
	// keep2 must run on the second node before keep goes: deleted earlier, keep2 could take
	// keep's node and the second node would be the one released.
	testenv.Eventually(t, 60*time.Second, "keep2 Running on the second node", func() (bool, error) {
		k, err := tenantPods.Get(ctx, "keep2", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		onSecond := false
		for _, cl := range claims.Items {
			onSecond = onSecond || (string(cl.UID) != claimUID && cl.Spec.NodeName == k.Spec.NodeName)
		}
		return k.Status.Phase == "Running" && onSecond, fmt.Errorf("keep2 %s on %q", k.Status.Phase, k.Spec.NodeName)
	})
	zero := int64(0)
	if err := tenantPods.Delete(ctx, "keep", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the record holding only the second entry, deployed, and one claim left", func() (bool, error) {
		if err := c.List(ctx, &claims, client.InNamespace(gateway.AccountNamespace(acct.DID))); err != nil {
			return false, err
		}
		rec, _ := record()
		ok := len(claims.Items) == 1 && string(claims.Items[0].UID) != claimUID && rec != nil &&
			slices.Equal(recordEntries(rec), []string{second + "=requested"}) &&
			rec.Status != nil && rec.Status.Phase != nil && *rec.Status.Phase == "deployed"
		phase := ""
		if rec != nil && rec.Status != nil && rec.Status.Phase != nil {
			phase = *rec.Status.Phase
		}
		uids := []string{}
		for _, cl := range claims.Items {
			uids = append(uids, string(cl.UID))
		}
		return ok, fmt.Errorf("claims %v (first %s), record %v %s, want %s", uids, claimUID, recordEntries(rec), phase, second)
	})
	if inf, err := getInfra(); err != nil || len(inf.Spec.Contracts) != 1 || inf.Spec.Contracts[0].Name != second || inf.Status.Phase != v1alpha1.InfraDeployed {
		t.Fatalf("after the scale-in to one, the Infra %v: %+v", err, inf)
	}
	_, raw := record()
	for _, w := range []string{"nodeJoin", "ownerDid", "nodeClaimRef", "secret", "bundle", "clusterRef", "userData", "policy", "repoRef", "127.0.0.1"} {
		if strings.Contains(strings.ToLower(raw), strings.ToLower(w)) {
			t.Errorf("the record after the scale-in carries %q: %s", w, raw)
		}
	}

	// SCALE-IN-RECORD, to zero: the last node takes the record with the Infra.
	if err := tenantPods.Delete(ctx, "keep2", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	guests := filepath.Join(g.dir, "node-bidder", "guests")
	testenv.Eventually(t, 90*time.Second, "the Infra, its record and the node's guest gone after the scale to zero", func() (bool, error) {
		_, err := getInfra()
		rec, _ := record()
		left := substratetest.Procs(guests)
		return apierrors.IsNotFound(err) && rec == nil && len(left) == 0, fmt.Errorf("infra %v record %+v guest processes %v", err, rec, left)
	})
}

// spreadPodJSON is spreadPod as the JSON manifest kubectlApplyServerSide takes.
func spreadPodJSON(t *testing.T, name string) json.RawMessage {
	t.Helper()
	m, err := yaml.YAMLToJSON([]byte(spreadPod(name)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// recordEntries lists a published record's entries as sorted name=state pairs.
func recordEntries(rec *atinfra.Infra) []string {
	if rec == nil {
		return nil
	}
	var out []string
	for _, k := range rec.Contracts {
		out = append(out, k.Name+"="+k.State)
	}
	slices.Sort(out)
	return out
}
