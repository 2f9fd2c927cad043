package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/bench"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/testenv"
)

// tenantClient is a clientset of the tenant cluster behind kubeconfig kc.
func tenantClient(t *testing.T, kc string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// waitZeroNodes waits until the cluster has no claim and no Node, and its guests no process.
func (n *nodeUp) waitZeroNodes(cluster string, ts kubernetes.Interface, timeout time.Duration) {
	t := n.t
	t.Helper()
	testenv.Eventually(t, timeout, cluster+" back at zero nodes", func() (bool, error) {
		cs := n.claims(cluster)
		nodes, err := ts.CoreV1().Nodes().List(n.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(cs) == 0 && len(nodes.Items) == 0, fmt.Errorf("%d claims, %d nodes", len(cs), len(nodes.Items))
	})
	n.waitGuestsGone(30 * time.Second)
}

// TestBench_NodeScaleUp prints, for 5 pending pods one after another on a cluster at zero
// nodes with a 1 s bid window, the time from the pod's creation to Running on a newly rented
// node and where it goes: batch (pod -> NodeClaim, the node host's 1 s batch), market (claim
// -> contract Held: bundle, Infra entry, contract, rfp, the window, bid, accept), boot (Held ->
// Node registered: the guest's namespace, containerd, image import, kubelet), join (registered
// -> Ready), schedule (Ready -> the pod bound to the node: the scheduler retries an
// unschedulable pod with a backoff), start (bound -> Running: sandbox, container; the image is
// already on the node). Between runs the cluster goes back to zero nodes. It runs twice in
// one go: with up's default (every pod in a user namespace of its own) and with
// --pod-user-namespaces optional (the pods in the host's), so the cost of that layer is a
// pair from one run. SOCIALWEB_BENCH=1 runs it.
func TestBench_NodeScaleUp(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	var lines []string
	for _, mode := range []string{"required", "optional"} {
		t.Run("user namespaces "+mode, func(t *testing.T) {
			lines = append(lines, "user namespaces "+mode+": "+benchNodeScaleUp(t, "--pod-user-namespaces", mode))
		})
	}
	for _, l := range lines {
		t.Log(l)
	}
}

// benchNodeScaleUp is TestBench_NodeScaleUp on an up started with args; it returns the
// line of medians.
func benchNodeScaleUp(t *testing.T, args ...string) string {
	n := startNodeUp(t, append([]string{"--node-bid-window", "1s"}, args...)...)
	kc := n.cluster("b1", "maxNodes: 1, scaleHold: 1s")
	ts := tenantClient(t, kc)
	const runs = 5
	names := []string{"batch", "market", "boot", "join", "schedule", "start", "total"}
	phases := map[string][]time.Duration{}
	for i := 0; i < runs; i++ {
		pod := fmt.Sprintf("p%d", i)
		t0 := time.Now()
		tkubectl(t, kc, strings.Replace(spreadPod(pod), "app: spread", "app: bench", 1), "apply", "-f", "-")
		var claimAt, heldAt, registeredAt, readyAt, boundAt, runningAt time.Time
		var claim v1alpha1.NodeClaim
		testenv.Eventually(t, 120*time.Second, pod+" Running on a new node", func() (bool, error) {
			now := time.Now()
			if claimAt.IsZero() {
				for _, c := range n.claims("b1") {
					claim, claimAt = c, now
				}
			}
			if !claimAt.IsZero() && heldAt.IsZero() {
				if err := n.c.Get(n.ctx, client.ObjectKeyFromObject(&claim), &claim); err == nil && claim.Status.Infra != nil && claim.Status.Infra.ComputeContract != "" {
					var cc v1alpha1.ComputeContract
					if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: claim.Status.Infra.Workspace, Name: claim.Status.Infra.ComputeContract}, &cc); err == nil &&
						cc.Status.Phase == v1alpha1.ComputeContractHeld {
						heldAt = now
					}
				}
			}
			if !claimAt.IsZero() && readyAt.IsZero() {
				nd, err := ts.CoreV1().Nodes().Get(n.ctx, claim.Spec.NodeName, metav1.GetOptions{})
				if err == nil {
					if registeredAt.IsZero() {
						registeredAt = now
					}
					for _, c := range nd.Status.Conditions {
						if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
							readyAt = now
						}
					}
				} else if !apierrors.IsNotFound(err) {
					return false, err
				}
			}
			p, err := ts.CoreV1().Pods("default").Get(n.ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if p.Spec.NodeName != "" && boundAt.IsZero() {
				boundAt = now
			}
			if p.Status.Phase == corev1.PodRunning {
				runningAt = now
			}
			return !runningAt.IsZero(), fmt.Errorf("pod %s, claim %s %s", p.Status.Phase, claim.Name, claim.Status.Phase)
		})
		for _, at := range []*time.Time{&heldAt, &registeredAt, &readyAt, &boundAt} {
			if at.IsZero() { // a step seen only after a later one (between two polls)
				*at = runningAt
			}
		}
		run := map[string]time.Duration{"batch": claimAt.Sub(t0), "market": heldAt.Sub(claimAt), "boot": registeredAt.Sub(heldAt),
			"join": readyAt.Sub(registeredAt), "schedule": boundAt.Sub(readyAt), "start": runningAt.Sub(boundAt), "total": runningAt.Sub(t0)}
		var line []string
		for _, k := range names {
			phases[k] = append(phases[k], run[k])
			line = append(line, fmt.Sprintf("%s %.2fs", k, run[k].Seconds()))
		}
		t.Logf("run %d: %s", i+1, strings.Join(line, ", "))
		tkubectl(t, kc, "", "delete", "pod", pod, "--wait=false")
		n.waitZeroNodes("b1", ts, 90*time.Second)
	}
	var line []string
	for _, k := range names {
		line = append(line, fmt.Sprintf("%s %.2fs", k, bench.Median(phases[k]).Seconds()))
	}
	out := fmt.Sprintf("pending pod -> Running on a new node, 1 s bid window, median of %d: %s", runs, strings.Join(line, ", "))
	t.Log(out)
	return out
}

// TestBench_NodeScaleThreeAndBack prints the wall time for three pods that each need a node
// (hostname anti-affinity, maxNodes 3, podsPerNode 1) to run on three newly rented nodes, then,
// the pods deleted, for the cluster to go back to zero claims and nodes, and what is left
// (nodes, guest processes). SOCIALWEB_BENCH=1 runs it.
func TestBench_NodeScaleThreeAndBack(t *testing.T) {
	n, kc, ts := startNodeBench(t, "b3", "maxNodes: 3, podsPerNode: 1, scaleHold: 1s")
	t0 := time.Now()
	tkubectl(t, kc, spreadPod("x1")+"---\n"+spreadPod("x2")+"---\n"+spreadPod("x3"), "apply", "-f", "-")
	n.waitClaimsRunning("b3", 3, 180*time.Second)
	for _, p := range []string{"x1", "x2", "x3"} {
		waitPod(t, kc, p, "Running", "", 60*time.Second)
	}
	up := time.Since(t0)
	t1 := time.Now()
	tkubectl(t, kc, "", "delete", "pod", "x1", "x2", "x3", "--wait=false")
	n.waitZeroNodes("b3", ts, 120*time.Second)
	down := time.Since(t1)
	nodes, err := ts.CoreV1().Nodes().List(n.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("0 -> 3 nodes, 3 pods Running: %.2fs; pods deleted -> 0 nodes (1 s hold): %.2fs; nodes left %d, guests seen %d, guest processes left %d",
		up.Seconds(), down.Seconds(), len(nodes.Items), len(n.tags), len(n.guestProcs()))
}

// TestBench_NodePodOnARunningNode prints the time from a pod's creation to Running when the
// cluster already has a node with room (the other half of the pending-pod figure: no rent),
// median of 5; the image is already on the node. SOCIALWEB_BENCH=1 runs it.
func TestBench_NodePodOnARunningNode(t *testing.T) {
	n, kc, ts := startNodeBench(t, "b2", "maxNodes: 1, scaleHold: 1h")
	running := func(pod string) {
		t.Helper()
		testenv.Eventually(t, 120*time.Second, pod+" Running", func() (bool, error) {
			p, err := ts.CoreV1().Pods("default").Get(n.ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return p.Status.Phase == corev1.PodRunning, fmt.Errorf("pod %s", p.Status.Phase)
		})
	}
	// The node: rented for a first pod, kept by the hour's scaleHold.
	tkubectl(t, kc, strings.Replace(spreadPod("keep"), "app: spread", "app: keep", 1), "apply", "-f", "-")
	running("keep")
	const runs = 5
	var ds []time.Duration
	for i := 0; i < runs; i++ {
		pod := fmt.Sprintf("q%d", i)
		t0 := time.Now()
		tkubectl(t, kc, strings.Replace(spreadPod(pod), "app: spread", "app: bench", 1), "apply", "-f", "-")
		running(pod)
		ds = append(ds, time.Since(t0))
		t.Logf("run %d: %.2fs", i+1, ds[i].Seconds())
		tkubectl(t, kc, "", "delete", "pod", pod, "--wait=false")
	}
	if nodes, err := ts.CoreV1().Nodes().List(n.ctx, metav1.ListOptions{}); err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes: %v %v, want the one node throughout", nodes, err)
	}
	t.Logf("pending pod -> Running with a node up (no rent), median of %d: %.2fs", runs, bench.Median(ds).Seconds())
}

// TestBench_NodeBatching prints what the batch of pending pods costs before a node is
// asked for: from the apply of a Deployment of 3 replicas (no node yet) to its NodeClaim,
// against what Karpenter's batching (1 s after the newest pending pod) gives on the same
// run's pods: the moment this test saw the last of them Unschedulable, plus 1 s. The
// ReplicaSet is settled once all three are tried, so the batch closes after
// scale.SettledIdle. Median of 5; between runs the cluster goes back to zero nodes.
// SOCIALWEB_BENCH=1 runs it.
func TestBench_NodeBatching(t *testing.T) {
	n, kc, ts := startNodeBench(t, "bb", "maxNodes: 1, scaleHold: 1s")
	const runs = 5
	var ours, karpenter []time.Duration
	for i := range runs {
		name := fmt.Sprintf("batch%d", i)
		deployment := strings.NewReplacer("name: keeper", "name: "+name, "app: keeper", "app: "+name, "replicas: 1", "replicas: 3").Replace(keeperDeployment)
		t0 := time.Now()
		tkubectl(t, kc, deployment, "apply", "-f", "-")
		var lastPending, claimAt time.Time
		testenv.Eventually(t, 60*time.Second, name+": a NodeClaim", func() (bool, error) {
			now := time.Now()
			pods, err := ts.CoreV1().Pods("default").List(n.ctx, metav1.ListOptions{LabelSelector: "app=" + name})
			if err != nil {
				return false, err
			}
			tried := 0
			for _, p := range pods.Items {
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
						tried++
					}
				}
			}
			if tried == 3 && lastPending.IsZero() {
				lastPending = now
			}
			if len(n.claims("bb")) > 0 {
				claimAt = now
			}
			return !claimAt.IsZero(), fmt.Errorf("%d of 3 pods Unschedulable", tried)
		})
		if lastPending.IsZero() { // seen only with the claim (between two polls)
			lastPending = claimAt
		}
		ours, karpenter = append(ours, claimAt.Sub(t0)), append(karpenter, lastPending.Add(scale.BatchIdle).Sub(t0))
		t.Logf("run %d: apply -> NodeClaim %.2fs; Karpenter's batch would close at %.2fs", i+1, claimAt.Sub(t0).Seconds(), lastPending.Add(scale.BatchIdle).Sub(t0).Seconds())
		tkubectl(t, kc, "", "delete", "deployment", name, "--wait=false")
		n.waitZeroNodes("bb", ts, 90*time.Second)
	}
	o, k := bench.Median(ours), bench.Median(karpenter)
	t.Logf("Deployment of 3 -> NodeClaim, median of %d: ours %.2fs, Karpenter's batching (1 s idle) %.2fs on the same pods: %.2fx",
		runs, o.Seconds(), k.Seconds(), o.Seconds()/k.Seconds())
}

// startNodeBench skips unless SOCIALWEB_BENCH is set, then starts up with a 1 s node bid
// window (and upArgs) and a tenant cluster of the given name and node settings: the
// kubeconfig and a client of it.
func startNodeBench(t *testing.T, cluster, settings string, upArgs ...string) (*nodeUp, string, kubernetes.Interface) {
	t.Helper()
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	n := startNodeUp(t, append([]string{"--node-bid-window", "1s"}, upArgs...)...)
	kc := n.cluster(cluster, settings)
	return n, kc, tenantClient(t, kc)
}

// TestBench_NodeFiftyPods prints, for 50 pods of mixed requests (seeded: CPU 50m-300m,
// memory 32-256 MiB) applied at once to a cluster with no node: the nodes bought against the
// bin-packing lower bound (the larger of the pods' total CPU and total memory over the
// largest node the Cluster allows, 2 CPUs and 4 GiB, rounded up; daemon pods left out), and
// the time from the apply to all 50 Running. SOCIALWEB_BENCH=1 runs it.
func TestBench_NodeFiftyPods(t *testing.T) {
	n, kc, ts := startNodeBench(t, "fifty", "maxNodes: 20, podsPerNode: 50, scaleHold: 1s", "--quota-nodes", "0")
	rng := rand.New(rand.NewSource(50))
	cpus, mems := []int64{50, 100, 200, 300}, []int64{32, 64, 128, 256}
	var manifest []string
	var totalCPU, totalMem int64
	for i := range 50 {
		c, m := cpus[rng.Intn(len(cpus))], mems[rng.Intn(len(mems))]
		totalCPU, totalMem = totalCPU+c, totalMem+m
		manifest = append(manifest, strings.Replace(sizedPod(fmt.Sprintf("p%02d", i), fmt.Sprintf("%dm", c), fmt.Sprintf("%dMi", m)),
			"namespace: default}", "namespace: default, labels: {bench: fifty}}", 1))
	}
	const nodeCPU, nodeMem = 2000, 4096
	bound := max((totalCPU+nodeCPU-1)/nodeCPU, (totalMem+nodeMem-1)/nodeMem)
	t0 := time.Now()
	tkubectl(t, kc, strings.Join(manifest, "---\n"), "apply", "-f", "-")
	var claimsAt time.Duration
	testenv.Eventually(t, 600*time.Second, "50 pods Running", func() (bool, error) {
		if claimsAt == 0 && len(n.claims("fifty")) > 0 {
			claimsAt = time.Since(t0)
		}
		pods, err := ts.CoreV1().Pods("default").List(n.ctx, metav1.ListOptions{LabelSelector: "bench=fifty"})
		if err != nil {
			return false, err
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == 50, fmt.Errorf("%d of 50 Running, %d claims", running, len(n.claims("fifty")))
	})
	all := time.Since(t0)
	claims := n.claims("fifty")
	// Each node: when its claim was made, its size, and what the scheduler put on it (the
	// plan packs nodes to the brim; the scheduler's own choices show here).
	pods, err := ts.CoreV1().Pods("default").List(n.ctx, metav1.ListOptions{LabelSelector: "bench=fifty"})
	if err != nil {
		t.Fatal(err)
	}
	onNode := map[string][2]int64{}
	for _, p := range pods.Items {
		r := p.Spec.Containers[0].Resources.Requests
		l := onNode[p.Spec.NodeName]
		onNode[p.Spec.NodeName] = [2]int64{l[0] + r.Cpu().MilliValue(), l[1] + r.Memory().Value()>>20}
	}
	var sizes []string
	for node, c := range claims {
		l := onNode[node]
		sizes = append(sizes, fmt.Sprintf("+%04.1fs %d CPU %d MiB holding %dm %d MiB",
			c.CreationTimestamp.Sub(t0.Truncate(time.Second)).Seconds(), c.Spec.CPUs, c.Spec.MemMiB, l[0], l[1]))
	}
	slices.Sort(sizes)
	t.Logf("50 pods (%dm CPU, %d MiB in all): first NodeClaim %.2fs, all Running %.2fs; %d nodes bought (%s), lower bound %d: %.2fx (goal <= 1.1x; load %s)",
		totalCPU, totalMem, claimsAt.Seconds(), all.Seconds(), len(claims), strings.Join(sizes, ", "), bound, float64(len(claims))/float64(bound), bench.LoadAvg())
}
