package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// getJob over XRPC reads a running Job's logs from the node it runs on: a cluster made through
// the gateway scales up to one node for the Job applied through the gateway, and getJob
// answers the Job Succeeded with its container's output, cut to tailLines.
func TestGateway_GetJobLogsFromANode(t *testing.T) {
	requireTenantHost(t)
	if err := node.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
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
	gwURL, pdsURL := up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var acct app.LocalAccount
	b, err := os.ReadFile(filepath.Join(dir, "pds", "account.json"))
	if err != nil || json.Unmarshal(b, &acct) != nil {
		t.Fatalf("account.json: %v", err)
	}
	pa := atclient.New(pdsURL)
	if _, err := pa.Login(ctx, acct.Handle, acct.Password); err != nil {
		t.Fatal(err)
	}
	a := &gwCaller{t: t, pds: pa, gw: gwURL, aud: aud}

	a.must(cluster.CreateClusterNSID, map[string]string{"name": "j1"}, nil)
	// Scale up after 3 s of demand rather than the default 2 min (no method sets it yet).
	c := coreClient(t, dir)
	var cl v1alpha1.Cluster
	key := client.ObjectKey{Namespace: gateway.AccountNamespace(acct.DID), Name: "j1"}
	if err := c.Get(ctx, key, &cl); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cl.DeepCopy())
	cl.Spec.ScaleHold = metav1.Duration{Duration: 3 * time.Second}
	if err := c.Patch(ctx, &cl, patch); err != nil {
		t.Fatal(err)
	}
	a.waitPhase("j1", "Ready", 90*time.Second)

	job := `{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"count"},"spec":{"backoffLimit":0,"template":{"spec":{
		"restartPolicy":"Never","automountServiceAccountToken":false,"containers":[{"name":"c","image":"` + node.BusyboxImage + `",
		"imagePullPolicy":"Never","command":["/bin/sh","-c","for i in 1 2 3 4 5; do echo line $i; done"]}]}}}}`
	t0 := time.Now()
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "j1", "manifest": json.RawMessage(job)}, nil)
	var out cluster.GetJobOutput
	testenv.Eventually(t, 180*time.Second, "getJob Succeeded with its log", func() (bool, error) {
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
	a.must(cluster.DeleteClusterNSID, map[string]string{"name": "j1"}, nil)
	testenv.Eventually(t, 90*time.Second, "j1 gone", func() (bool, error) {
		_, ok := a.list()["j1"]
		return !ok, nil
	})
}
