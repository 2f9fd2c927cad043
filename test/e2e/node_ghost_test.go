package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/nodehost"
	"socialweb.computer/internal/testenv"
)

// A Cluster stopped with spec.running false releases its nodes while its apiserver is down,
// so their Node objects stay in its store. Started again, it must not show them: the node
// host removes every Node it labelled as a claim's once no claim names it, with the pods
// still bound to it, and the Cluster counts no node.
func TestNode_StopAndStartLeavesNoGhostNode(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	kc := n.cluster("g1", "maxNodes: 1, scaleHold: 30s")
	tkubectl(t, kc, spreadPod("sleeper"), "apply", "-f", "-")
	var nodeName string
	for name := range n.waitClaimsRunning("g1", 1, 120*time.Second) {
		nodeName = name
	}
	waitPod(t, kc, "sleeper", "Running", nodeName, 90*time.Second)
	testenv.Eventually(t, 30*time.Second, "the claimed node labelled", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", "jsonpath={.metadata.labels}")
		return strings.Contains(out, nodehost.ClaimLabel), fmt.Errorf("labels %s", out)
	})

	key := client.ObjectKey{Namespace: "default", Name: "g1"}
	setRunning := func(running bool) {
		t.Helper()
		var cl v1alpha1.Cluster
		if err := n.c.Get(n.ctx, key, &cl); err != nil {
			t.Fatal(err)
		}
		if err := n.c.Patch(n.ctx, &cl, client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(`{"spec":{"running":%v}}`, running)))); err != nil {
			t.Fatal(err)
		}
	}
	setRunning(false)
	waitPhase(t, n.c, key, v1alpha1.ClusterUnavailable, 60*time.Second)
	testenv.Eventually(t, 90*time.Second, "every claim released", func() (bool, error) {
		cs := n.claims("g1")
		return len(cs) == 0, lazyErr(func() string { return fmt.Sprintf("%d claims\n%s", len(cs), n.dump()) })
	})
	n.waitGuestsGone(60 * time.Second)

	setRunning(true)
	waitPhase(t, n.c, key, v1alpha1.ClusterReady, 60*time.Second)
	testenv.Eventually(t, 60*time.Second, "no ghost node and no pod bound to it", func() (bool, error) {
		nodes, _ := tkubectlErr(kc, "get", "nodes", "-o", "name")
		pods, _ := tkubectlErr(kc, "get", "pods", "-A", "-o", "jsonpath={range .items[*]}{.metadata.name}@{.spec.nodeName} {end}")
		return strings.TrimSpace(nodes) == "" && !strings.Contains(pods, nodeName),
			fmt.Errorf("nodes %q, pods %q\n%s", nodes, pods, n.dump())
	})
	testenv.Eventually(t, 30*time.Second, "the Cluster counts no node", func() (bool, error) {
		var cl v1alpha1.Cluster
		if err := n.c.Get(n.ctx, key, &cl); err != nil {
			return false, err
		}
		for _, c := range cl.Status.Conditions {
			if c.Type == "Ready" {
				return strings.Contains(c.Message, "serving with 0 nodes"), fmt.Errorf("%s", c.Message)
			}
		}
		return false, fmt.Errorf("no Ready condition")
	})
}
