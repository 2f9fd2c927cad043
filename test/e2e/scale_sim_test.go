package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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

// sizedPod is a pod that requests cpu and memory.
func sizedPod(name, cpu, mem string) string {
	return strings.Replace(bigPod(name), `resources: {requests: {cpu: "64"}}`,
		`resources: {requests: {cpu: "`+cpu+`", memory: "`+mem+`"}}`, 1)
}

// A node is rented at the size of the pod it is for: a pod asking for 1.5 CPUs and 300 MiB
// gets a node of 2 CPUs and 512 MiB (whole CPUs, memory in 256 MiB steps), whose contract
// asks the market for that size and whose allocatable is exactly that, and runs there.
func TestScale_ANodeIsRentedAtItsPodsSize(t *testing.T) {
	n := startNodeUp(t)
	kc := n.cluster("sz", "maxNodes: 2, podsPerNode: 10, scaleHold: 30s")

	t0 := time.Now()
	tkubectl(t, kc, sizedPod("web", "1500m", "300Mi"), "apply", "-f", "-")
	claims := n.waitClaimsRunning("sz", 1, 240*time.Second)
	nodeName := waitPod(t, kc, "web", "Running", "", 90*time.Second)
	t.Logf("pod Running on %s in %.2fs", nodeName, time.Since(t0).Seconds())
	c, ok := claims[nodeName]
	if !ok {
		t.Fatalf("web on %s, no claim of the cluster's (%v)", nodeName, claims)
	}
	if c.Spec.CPUs != 2 || c.Spec.MemMiB != 512 {
		t.Errorf("claim %s asks %d CPU %d MiB, want 2 CPU 512 MiB", c.Name, c.Spec.CPUs, c.Spec.MemMiB)
	}
	alloc, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", `jsonpath={.status.allocatable.cpu} {.status.allocatable.memory}`)
	f := strings.Fields(alloc)
	if len(f) != 2 {
		t.Fatalf("node %s allocatable %q", nodeName, alloc)
	}
	cpu, errC := resource.ParseQuantity(f[0])
	mem, errM := resource.ParseQuantity(f[1])
	if errC != nil || errM != nil || cpu.MilliValue() != 2000 || mem.Value() != 512<<20 {
		t.Errorf("node %s allocatable %q, want 2 CPUs and 512Mi: a node advertises its contract", nodeName, alloc)
	}
}
