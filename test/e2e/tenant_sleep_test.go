package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
)

// A Cluster with sleepAfter stops its control plane once unused (no process left, the
// store kept) and wakes on the first request: `kubectl get` through its server URL and a
// gateway call each wake it and are answered, late rather than refused, with what the
// store held. Serial: the wake times it prints are of an otherwise quiet machine.
func TestTenant_SleepsAndWakes(t *testing.T) {
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	gwURL, pdsURL := up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	a, acct, _ := ownerCaller(t, up, pdsURL, gwURL, aud)
	c := coreClient(t, dir)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: gateway.AccountNamespace(acct.DID), Name: "s1"}

	a.must(cluster.CreateClusterNSID, map[string]string{"name": "s1"}, nil)
	cl := waitPhase(t, c, key, v1alpha1.ClusterReady, 90*time.Second)
	kc := mint(t, dir, cl)
	tkubectl(t, kc, "", "create", "configmap", "kept", "--from-literal=a=b")

	// Asleep 10 s after the last request: the control plane's process is gone.
	if err := c.Patch(ctx, cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"sleepAfter":"10s"}}`))); err != nil {
		t.Fatal(err)
	}
	asleep := func(what string) {
		t.Helper()
		t0 := time.Now()
		s := waitPhase(t, c, key, v1alpha1.ClusterSleeping, 60*time.Second)
		t.Logf("%s -> Sleeping in %.1fs: %s", what, time.Since(t0).Seconds(), readyMessage(s))
		if pids := controlPlanesRunning(dir); len(pids) != 0 {
			t.Fatalf("control plane processes %v left while Sleeping", pids)
		}
		if s.Status.Server != cl.Status.Server {
			t.Errorf("server %q while asleep, was %q: a minted kubeconfig must keep working", s.Status.Server, cl.Status.Server)
		}
	}
	asleep("sleepAfter set")

	// kubectl through the gate wakes it; the answer holds the stored object.
	t0 := time.Now()
	out := tkubectl(t, kc, "", "get", "configmap", "kept", "-o", "jsonpath={.data.a}")
	t.Logf("kubectl get on a sleeping cluster answered in %.2fs", time.Since(t0).Seconds())
	if out != "b" {
		t.Errorf("kubectl get configmap kept after the wake: %q, want b", out)
	}
	waitPhase(t, c, key, v1alpha1.ClusterReady, 30*time.Second)

	asleep("the last kubectl")

	// A gateway call (an apply on the owner's behalf) wakes it too.
	t0 = time.Now()
	var applied cluster.KubectlApplyServerSideOutput
	a.must(cluster.KubectlApplyServerSideNSID, map[string]any{"cluster": "s1",
		"manifest": json.RawMessage(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"woken","namespace":"default"},"data":{"x":"y"}}`)}, &applied)
	t.Logf("kubectlApplyServerSide on a sleeping cluster answered in %.2fs", time.Since(t0).Seconds())
	if applied.Kind != "ConfigMap" || applied.Name != "woken" {
		t.Errorf("apply through the gateway after the wake: %+v", applied)
	}
	waitPhase(t, c, key, v1alpha1.ClusterReady, 30*time.Second)
	if out := tkubectl(t, kc, "", "get", "configmap", "woken", "-o", "jsonpath={.data.x}"); out != "y" {
		t.Errorf("the configmap applied through the gateway: %q", out)
	}

	// Unset, it stays awake past sleepAfter.
	if err := c.Patch(ctx, cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"sleepAfter":null}}`))); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second)
	if got := waitPhase(t, c, key, v1alpha1.ClusterReady, 5*time.Second); len(controlPlanesRunning(dir)) != 1 {
		t.Errorf("sleepAfter unset: phase %s, control planes %v; want one awake", got.Status.Phase, controlPlanesRunning(dir))
	}
}

func readyMessage(c *v1alpha1.Cluster) string {
	for _, cond := range c.Status.Conditions {
		if cond.Type == string(v1alpha1.ConditionReady) {
			return cond.Reason + ": " + cond.Message
		}
	}
	return ""
}
