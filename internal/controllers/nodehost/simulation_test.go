package nodehost

import (
	"fmt"
	"math/rand"
	goruntime "runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/scale/simulate"
)

func sized(n *corev1.Node, cpu, mem, pods string) *corev1.Node {
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu),
		corev1.ResourceMemory: resource.MustParse(mem), corev1.ResourcePods: resource.MustParse(pods)}
	return n
}

func requesting(cpu string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}
	}
}

func onNode(name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.NodeName = name; p.Status.Phase = corev1.PodRunning }
}

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}

func nodeNames(nodes []*corev1.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return out
}

// What the simulation is given: the pending pods as the decision counts them, every bound
// pod still running (daemon pods too: they use the node), the joined nodes not being
// released plus a node of the size on offer for each claim in flight, each taking at most
// podsPerNode pods besides its daemon pods, and the room maxNodes leaves.
func TestPlanInputOf(t *testing.T) {
	n1 := sized(node("n1", corev1.ConditionTrue), "2", "4Gi", "110")
	n1.Labels = map[string]string{corev1.LabelHostname: "n1", ClaimLabel: "c-n1", corev1.LabelArchStable: "amd64"}
	n1.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule},
		{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule},
		{Key: "dedicated", Value: "ci", Effect: corev1.TaintEffectNoSchedule}}
	n2 := sized(node("n2", corev1.ConditionFalse), "2", "4Gi", "110") // registered, not Ready: its claim is in flight
	n3 := sized(node("n3", corev1.ConditionTrue), "1", "8Gi", "110")  // its claim is being deleted
	n0 := sized(node("n0", corev1.ConditionTrue), "1", "1Gi", "110")  // joined by hand, no claim
	n0.Labels = map[string]string{corev1.LabelHostname: "n0", corev1.LabelArchStable: "amd64"}
	pods := []*corev1.Pod{
		pod("pending", unschedulable),
		pod("daemon-pending", all(unschedulable, ownedBy("DaemonSet"))),
		pod("finished-pending", func(p *corev1.Pod) { unschedulable(p); p.Status.Phase = corev1.PodFailed }),
		pod("not-yet-tried", nil),
		pod("running", onNode("n1")),
		pod("daemon", all(onNode("n1"), ownedBy("DaemonSet"), requesting("100m"))),
		pod("done", func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodSucceeded }),
		pod("daemon-n2", all(onNode("n2"), ownedBy("DaemonSet"))),
		nil,
	}
	claims := []*v1alpha1.NodeClaim{
		claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false),
		claim("c-n2", "n2", v1alpha1.NodeClaimJoining, false),
		claim("c-n3", "n3", v1alpha1.NodeClaimRunning, true),
		claim("c-n4", "n4", v1alpha1.NodeClaimBidding, false),
		claim("c-n5", "n5", v1alpha1.NodeClaimBidding, true),
		nil,
	}
	claims[3].Spec.CPUs, claims[3].Spec.MemMiB = 2, 1024
	pi := PlanInputOf(pods, []*corev1.Node{n2, n3, n1, n0, nil}, claims, Settings{MaxNodes: 7, PodsPerNode: 3})
	if got, want := podNames(pi.Pending), []string{"pending"}; !slices.Equal(got, want) {
		t.Errorf("pending %v, want %v", got, want)
	}
	if got, want := podNames(pi.Bound), []string{"running", "daemon", "daemon-n2"}; !slices.Equal(got, want) {
		t.Errorf("bound %v, want %v", got, want)
	}
	if got, want := nodeNames(pi.Nodes), []string{"n1", "n0", "n2", "n4"}; !slices.Equal(got, want) {
		t.Errorf("nodes %v, want %v (joined ones not being released, then the claims in flight)", got, want)
	}
	// Joined nodes 3 (n0, n1, n3), claims whose node has not joined 3 (n2, n4, n5 deleting).
	if pi.MaxNew != 1 {
		t.Errorf("maxNew %d, want 1", pi.MaxNew)
	}
	// The largest size of the default range (2 CPUs, 4 GiB) less n1's daemon pod.
	want := simulate.NodeTemplate{MilliCPU: 1900, MemBytes: 4 << 30, Pods: 3, Labels: map[string]string{corev1.LabelArchStable: "amd64"}}
	if d := cmp.Diff(want, pi.Template); d != "" {
		t.Errorf("template (-want +got)\n%s", d)
	}
	if pi.Overhead != (simulate.Load{MilliCPU: 100}) || pi.Sizes != scale.DefaultSizeRange {
		t.Errorf("overhead %+v, sizes %+v", pi.Overhead, pi.Sizes)
	}
	// A claim in flight brings a node of its size; one that states none, the contract's default.
	for _, tc := range []struct {
		node     int
		cpu, mem string
	}{{2, "1", "256Mi"}, {3, "2", "1Gi"}} {
		a := pi.Nodes[tc.node].Status.Allocatable
		if !a.Cpu().Equal(resource.MustParse(tc.cpu)) || !a.Memory().Equal(resource.MustParse(tc.mem)) {
			t.Errorf("%s allocatable %v, want %s CPU %s", pi.Nodes[tc.node].Name, a, tc.cpu, tc.mem)
		}
	}
	podsOf := map[string]int64{}
	for _, n := range pi.Nodes {
		podsOf[n.Name] = n.Status.Allocatable.Pods().Value()
	}
	// podsPerNode plus the daemon pods bound there.
	if d := cmp.Diff(map[string]int64{"n1": 4, "n0": 3, "n2": 4, "n4": 3}, podsOf); d != "" {
		t.Errorf("pods each node takes (-want +got)\n%s", d)
	}
	// Ready: the not-ready taint is stale, the node host lifts its own; the others stay.
	if d := cmp.Diff([]corev1.Taint{{Key: "dedicated", Value: "ci", Effect: corev1.TaintEffectNoSchedule}}, pi.Nodes[0].Spec.Taints); d != "" {
		t.Errorf("n1 taints (-want +got)\n%s", d)
	}
	if n1.Status.Allocatable.Pods().Value() != 110 || len(n1.Spec.Taints) != 3 {
		t.Errorf("the tenant's Node was changed: %v", n1.Status.Allocatable)
	}
	if got := pi.Nodes[3].Labels; got[corev1.LabelHostname] != "n4" || got[corev1.LabelArchStable] != "amd64" || got[ClaimLabel] != "" {
		t.Errorf("claim in flight's node labels %v", got)
	}

	// Before any node joined: the cluster's own range, the labels every node registers
	// with, storage that bounds nothing.
	early := PlanInputOf(pods, []*corev1.Node{n2}, claims, Settings{MaxNodes: 7, PodsPerNode: 3,
		NodeSize: &v1alpha1.NodeSizeRange{MinCPUs: 2, MaxCPUs: 8, MaxMemMiB: 16384}})
	want = simulate.NodeTemplate{MilliCPU: 8000, MemBytes: 16 << 30, Pods: 3, EphemeralStorageBytes: unknownEphemeralStorage,
		Labels: map[string]string{corev1.LabelOSStable: "linux", corev1.LabelArchStable: goruntime.GOARCH}}
	if d := cmp.Diff(want, early.Template); d != "" {
		t.Errorf("template before a node joined (-want +got)\n%s", d)
	}
	if got := nodeNames(early.Nodes); !slices.Equal(got, []string{"n1", "n2", "n4"}) {
		t.Errorf("nodes before any joined %v, want the claims in flight", got)
	}
	if pi := PlanInputOf(pods, []*corev1.Node{n1}, claims, Settings{MaxNodes: 1, PodsPerNode: 3}); pi.MaxNew != 0 {
		t.Errorf("over maxNodes: maxNew %d, want 0", pi.MaxNew)
	}
}

// The simulation's placements as the decision reads them: a pod that fits a joined node or a
// claim in flight waits, one that fits nowhere says the scheduler's reason, one that only
// maxNodes keeps from a new node asks for one.
func TestSimulationOf(t *testing.T) {
	n1 := sized(node("n1", corev1.ConditionTrue), "2", "4Gi", "110")
	pods := []*corev1.Pod{
		pod("busy", all(onNode("n1"), requesting("1"))),
		pod("fits", all(unschedulable, requesting("500m"))),
		pod("huge", all(unschedulable, requesting("64"))),
		pod("x", all(unschedulable, requesting("1500m"))),
		pod("y", all(unschedulable, requesting("1500m"))),
		pod("z", all(unschedulable, requesting("1500m"))),
	}
	claims := []*v1alpha1.NodeClaim{claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false), claim("c-n2", "n2", v1alpha1.NodeClaimBidding, false)}
	pi := PlanInputOf(pods, []*corev1.Node{n1}, claims, Settings{MaxNodes: 3, PodsPerNode: 10})
	sim, err := SimulationOf(pi)
	if err != nil {
		t.Fatal(err)
	}
	// n2 (in flight, the default 1 CPU) takes no 1.5-CPU pod: x on the one new node maxNodes
	// leaves, sized 2 CPUs for it, y and z no room, fits on n1.
	want := &scale.Simulation{NewNodes: 1, OnNodes: map[string]string{"default/fits": "n1"},
		Unplaced: map[string]string{"default/huge": "Insufficient cpu"}, NewNodeSizes: []scale.Size{{CPUs: 2, MemMiB: 256}},
		NewNodePods: [][]string{{"default/x"}}}
	if d := cmp.Diff(want, sim); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}

	// podsPerNode bounds a node as it bounds the slot counting: n1 holds its one pod.
	pi = PlanInputOf(pods[:2], []*corev1.Node{n1}, claims[:1], Settings{MaxNodes: 3, PodsPerNode: 1})
	if sim, _ := SimulationOf(pi); sim.NewNodes != 1 || len(sim.OnNodes) != 0 {
		t.Errorf("podsPerNode 1, n1 busy: %+v, want a new node", sim)
	}
}

// The Scaling condition names each pod no node can run with the scheduler's reason.
func TestUnfittableMessage(t *testing.T) {
	d := scale.Decision{Unfittable: []string{"default/a", "default/big", "default/c", "default/d", "default/e", "default/f", "default/g"},
		UnfittableWhy: map[string]string{"default/big": "Insufficient cpu"}}
	got := unfittable(d)
	if want := "default/a; default/big: Insufficient cpu; default/c; default/d; default/e; and 2 more"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if !strings.Contains(got, "default/big: Insufficient cpu") {
		t.Error(got)
	}
}

// A Cluster's nodeArch is the architecture of every node it would buy: a pod that selects
// another is reported with the scheduler's reason, one that selects it is rented for, before
// any node joined (when the template would otherwise take this host's) and after one of
// another architecture did.
func TestSimulationNodeArch(t *testing.T) {
	archPod := func(name, arch string) *corev1.Pod {
		return pod(name, all(unschedulable, requesting("100m"), func(p *corev1.Pod) {
			p.Spec.NodeSelector = map[string]string{corev1.LabelArchStable: arch}
		}))
	}
	amd := sized(node("amd", corev1.ConditionTrue), "2", "4Gi", "110")
	amd.Labels = map[string]string{corev1.LabelHostname: "amd", corev1.LabelArchStable: "amd64"}
	for _, nodes := range [][]*corev1.Node{nil, {amd}} {
		pods := []*corev1.Pod{archPod("wants-arm", "arm64"), archPod("wants-amd", "amd64"), archPod("wants-s390x", "s390x")}
		pi := PlanInputOf(pods, nodes, nil, Settings{MaxNodes: 3, PodsPerNode: 10, Arch: "arm64"})
		if got := pi.Template.Labels[corev1.LabelArchStable]; got != "arm64" {
			t.Fatalf("%d nodes: template arch %q, want the cluster's arm64", len(nodes), got)
		}
		sim, err := SimulationOf(pi)
		if err != nil {
			t.Fatal(err)
		}
		if sim.NewNodes != 1 || !slices.Equal(sim.NewNodePods[0], []string{"default/wants-arm"}) {
			t.Errorf("%d nodes: new nodes %d for %v, want one for wants-arm", len(nodes), sim.NewNodes, sim.NewNodePods)
		}
		if _, ok := sim.Unplaced["default/wants-s390x"]; !ok {
			t.Errorf("%d nodes: wants-s390x not reported: %+v", len(nodes), sim)
		}
		_, unplaced := sim.Unplaced["default/wants-amd"]
		_, onAmd := sim.OnNodes["default/wants-amd"]
		if len(nodes) == 0 && !unplaced || len(nodes) > 0 && !onAmd {
			t.Errorf("%d nodes: wants-amd unplaced %v, on a node %v; want reported with no node, on amd with one", len(nodes), unplaced, onAmd)
		}
	}
}

func requestingBoth(cpu, mem string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}}
	}
}

func TestStrandingRoom(t *testing.T) {
	tmpl := simulate.NodeTemplate{MilliCPU: 2000, MemBytes: 4 << 30}
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
		want simulate.Load
	}{
		{"none", nil, simulate.Load{}},
		{"the largest of each resource", []*corev1.Pod{pod("a", requestingBoth("300m", "64Mi")), pod("b", requestingBoth("50m", "256Mi"))},
			simulate.Load{MilliCPU: 300, MemBytes: 256 << 20}},
		{"never past what leaves the largest room alone", []*corev1.Pod{pod("a", requestingBoth("1500m", "3Gi"))},
			simulate.Load{MilliCPU: 500, MemBytes: 1 << 30}},
		{"a pod of the whole node: none", []*corev1.Pod{pod("a", requestingBoth("2", "4Gi"))}, simulate.Load{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StrandingRoom(tc.pods, tmpl); got != tc.want {
				t.Fatalf("StrandingRoom = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// 50 pods of mixed requests (TestBench_NodeFiftyPods's) on a cluster with no node: the plan
// keeps the bin-packing bound's 5 nodes, and each is rented with room for the largest pod
// beyond what the plan put on it (or at the largest size), so the scheduler placing them
// otherwise strands none. Where the room would take a node more, the plan stays tight; one
// new node is rented at what it holds.
func TestSimulationLeavesRoomForTheScheduler(t *testing.T) {
	rng := rand.New(rand.NewSource(50))
	cpus, mems := []string{"50m", "100m", "200m", "300m"}, []string{"32Mi", "64Mi", "128Mi", "256Mi"}
	var pods []*corev1.Pod
	for i := range 50 {
		pods = append(pods, pod(fmt.Sprintf("p%02d", i), all(unschedulable, requestingBoth(cpus[rng.Intn(4)], mems[rng.Intn(4)]))))
	}
	pi := PlanInputOf(pods, nil, nil, Settings{MaxNodes: 20, PodsPerNode: 50})
	sim, err := SimulationOf(pi)
	if err != nil {
		t.Fatal(err)
	}
	if sim.NewNodes != 5 || len(sim.Unplaced) != 0 {
		t.Fatalf("%d new nodes, unplaced %v: want the bound's 5 and every pod placed", sim.NewNodes, sim.Unplaced)
	}
	load := map[string]scale.Resources{}
	for _, p := range pods {
		load["default/"+p.Name] = PodOf(p).Requests
	}
	for k, names := range sim.NewNodePods {
		var l scale.Resources
		for _, n := range names {
			l.MilliCPU, l.MemBytes = l.MilliCPU+load[n].MilliCPU, l.MemBytes+load[n].MemBytes
		}
		got := sim.NewNodeSizes[k].Resources()
		max := pi.Sizes.Max.Resources()
		if (got.MilliCPU < l.MilliCPU+300 && got.MilliCPU < max.MilliCPU) || (got.MemBytes < l.MemBytes+256<<20 && got.MemBytes < max.MemBytes) {
			t.Errorf("node %d: %v for %dm %d MiB: no room for a 300m 256 MiB pod more", k+1, sim.NewNodeSizes[k], l.MilliCPU, l.MemBytes>>20)
		}
	}

	// Pods large beside a node: two nodes hold 1200m + 600m each to the brim; with the room
	// (800m) they would take three, so the plan stays tight.
	var large []*corev1.Pod
	for _, c := range []string{"600m", "600m", "1200m", "1200m"} {
		large = append(large, pod(fmt.Sprintf("l%d", len(large)), all(unschedulable, requestingBoth(c, "64Mi"))))
	}
	tight, err := SimulationOf(PlanInputOf(large, nil, nil, Settings{MaxNodes: 20, PodsPerNode: 50}))
	if err != nil {
		t.Fatal(err)
	}
	if tight.NewNodes != 2 || tight.NewNodeSizes[0].CPUs != 2 || tight.NewNodeSizes[1].CPUs != 2 {
		t.Fatalf("1200m and 600m pods: %d nodes %v, want 2 of 2 CPUs", tight.NewNodes, tight.NewNodeSizes)
	}

	one, err := SimulationOf(PlanInputOf(pods[:3], nil, nil, Settings{MaxNodes: 20, PodsPerNode: 50}))
	if err != nil {
		t.Fatal(err)
	}
	var l scale.Resources
	for _, p := range pods[:3] {
		l.MilliCPU, l.MemBytes = l.MilliCPU+PodOf(p).Requests.MilliCPU, l.MemBytes+PodOf(p).Requests.MemBytes
	}
	if want, _ := pi.Sizes.Fit(l); one.NewNodes != 1 || one.NewNodeSizes[0] != want {
		t.Fatalf("one new node: %+v, want one of %v", one, want)
	}
}
