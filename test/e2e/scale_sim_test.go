package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// bigPod is a pod that requests 64 CPUs: no node the market rents here offers that many.
func bigPod(name string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sleep", "3600"]
    resources: {requests: {cpu: "64"}}
`
}

// The scale decision runs the scheduler's filters (maxNodes 4, podsPerNode 10): three pods
// with hostname anti-affinity get three nodes although one node has slots for ten, each
// Running on its own; a pod that requests 64 CPUs fits no node of the size rented, stays
// Pending, rents nothing (a fourth node would be within maxNodes) and is named on the
// Cluster's Scaling condition with the scheduler's reason, "Insufficient cpu".
func TestScale_AntiAffinityGetsANodeEachAndA64CPUPodIsReported(t *testing.T) {
	n := startNodeUp(t)
	kc := n.cluster("aa", "maxNodes: 4, podsPerNode: 10, scaleHold: 30s")

	t0 := time.Now()
	tkubectl(t, kc, spreadPod("a1")+"---\n"+spreadPod("a2")+"---\n"+spreadPod("a3")+"---\n"+bigPod("big"), "apply", "-f", "-")
	claims := n.waitClaimsRunning("aa", 3, 240*time.Second)
	t.Logf("four pods -> three claims Running in %.2fs", time.Since(t0).Seconds())
	on := map[string]string{}
	for _, p := range []string{"a1", "a2", "a3"} {
		nodeName := waitPod(t, kc, p, "Running", "", 90*time.Second)
		if prev, ok := on[nodeName]; ok {
			t.Fatalf("%s and %s both on %s", prev, p, nodeName)
		}
		if _, ok := claims[nodeName]; !ok {
			t.Fatalf("%s on %s, no claim of the cluster's (%v)", p, nodeName, claims)
		}
		on[nodeName] = p
	}
	t.Logf("three pods Running on three nodes in %.2fs", time.Since(t0).Seconds())

	var msg string
	testenv.Eventually(t, 60*time.Second, "Scaling names default/big with Insufficient cpu", func() (bool, error) {
		var cl v1alpha1.Cluster
		if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "aa"}, &cl); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(cl.Status.Conditions, string(v1alpha1.ConditionScaling))
		if c == nil {
			return false, fmt.Errorf("no Scaling condition")
		}
		msg = c.Message
		return strings.Contains(msg, "default/big: Insufficient cpu"), fmt.Errorf("%s: %s", c.Reason, c.Message)
	})
	t.Logf("Scaling: %s", msg)
	// Past a batch and more: the big pod still Pending, still three claims.
	time.Sleep(15 * time.Second)
	if out, _ := tkubectlErr(kc, "get", "pod", "big", "-o", `jsonpath={.status.phase}/{.spec.nodeName}`); out != "Pending/" {
		t.Errorf("big: %q, want Pending and unbound", out)
	}
	if cs := n.claims("aa"); len(cs) != 3 {
		t.Errorf("%d claims, want 3 (the big pod rents nothing)\n%s", len(cs), n.dump())
	}
	for _, p := range []string{"a1", "a2", "a3"} {
		waitPod(t, kc, p, "Running", "", 10*time.Second)
	}
}
