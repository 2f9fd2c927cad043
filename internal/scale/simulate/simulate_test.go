package simulate

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const gib = 1 << 30

// offer is a 2-CPU, 4 GiB node of the kind "standard".
var offer = NodeTemplate{MilliCPU: 2000, MemBytes: 4 * gib, Labels: map[string]string{"size": "standard"}}

type podOpt func(*corev1.Pod)

// pod is a pending pod in namespace "app" asking for milliCPU and memory.
func pod(name string, milliCPU, mem int64, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, Labels: map[string]string{"name": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewMilliQuantity(milliCPU, resource.DecimalSI),
				corev1.ResourceMemory: *resource.NewQuantity(mem, resource.BinarySI),
			}}}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func labelled(k, v string) podOpt { return func(p *corev1.Pod) { p.Labels[k] = v } }

func on(node string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = node } }

func nominatedTo(node string) podOpt {
	return func(p *corev1.Pod) { p.Status.NominatedNodeName = node }
}

// antiAffine keeps the pod off any node that runs a pod labelled k=v.
func antiAffine(k, v string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}},
				TopologyKey:   corev1.LabelHostname,
			}}}}
	}
}

func selecting(k, v string) podOpt {
	return func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{k: v} }
}

func tolerating(key string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists})
	}
}

func hostPort(port int32) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports,
			corev1.ContainerPort{ContainerPort: 8080, HostPort: port, Protocol: corev1.ProtocolTCP})
	}
}

func inNamespace(ns string) podOpt { return func(p *corev1.Pod) { p.Namespace = ns } }

// spread spreads the pods labelled k=v over hostnames, at most one apart.
func spread(k, v string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, corev1.TopologySpreadConstraint{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{k: v}},
		})
	}
}

// node is an existing node of the offer's kind, named name.
func node(name string) *corev1.Node { return offer.Node(name) }

func TestPlan(t *testing.T) {
	tainted := offer
	tainted.Taints = []corev1.Taint{{Key: "dedicated", Value: "batch", Effect: corev1.TaintEffectNoSchedule}}
	tests := []struct {
		name     string
		pending  []*corev1.Pod
		nodes    []*corev1.Node
		bound    []*corev1.Pod
		template NodeTemplate
		maxNew   int
		want     Result
	}{{
		name: "pods with hostname anti-affinity to each other get a new node each",
		pending: []*corev1.Pod{
			pod("a", 100, gib, labelled("app", "db"), antiAffine("app", "db")),
			pod("b", 100, gib, labelled("app", "db"), antiAffine("app", "db")),
			pod("c", 100, gib, labelled("app", "db"), antiAffine("app", "db")),
		},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 3, Placements: []Placement{
			{Pod: "app/a", NewNode: 1}, {Pod: "app/b", NewNode: 2}, {Pod: "app/c", NewNode: 3}}},
	}, {
		name: "a pod larger than any new node fits nowhere, the others still get nodes",
		pending: []*corev1.Pod{
			pod("small-1", 500, gib), pod("huge", 64000, gib), pod("small-2", 500, gib),
		},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{
			{Pod: "app/huge", Reason: "Insufficient cpu"},
			{Pod: "app/small-1", NewNode: 1}, {Pod: "app/small-2", NewNode: 1}}},
	}, {
		name:     "four 1-CPU pods on 2-CPU nodes: two nodes",
		pending:  []*corev1.Pod{pod("a", 1000, gib), pod("b", 1000, gib), pod("c", 1000, gib), pod("d", 1000, gib)},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 2, Placements: []Placement{
			{Pod: "app/a", NewNode: 1}, {Pod: "app/b", NewNode: 1}, {Pod: "app/c", NewNode: 2}, {Pod: "app/d", NewNode: 2}},
			NewNodeLoads: []Load{{MilliCPU: 2000, MemBytes: 2 * gib}, {MilliCPU: 2000, MemBytes: 2 * gib}}},
	}, {
		name:     "mixed requests are packed larger first",
		pending:  []*corev1.Pod{pod("s1", 500, gib), pod("l1", 1500, gib), pod("s2", 500, gib), pod("l2", 1500, gib)},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 2, Placements: []Placement{
			{Pod: "app/l1", NewNode: 1}, {Pod: "app/l2", NewNode: 2}, {Pod: "app/s1", NewNode: 1}, {Pod: "app/s2", NewNode: 2}},
			NewNodeLoads: []Load{{MilliCPU: 2000, MemBytes: 2 * gib}, {MilliCPU: 2000, MemBytes: 2 * gib}}},
	}, {
		name:     "a new node's load is what was placed on it, an existing node's counts nowhere",
		pending:  []*corev1.Pod{pod("new", 1000, gib), pod("fits", 200, gib/4)},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("running", 1500, gib, on("n1"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/new", NewNode: 1}, {Pod: "app/fits", Node: "n1"}},
			NewNodeLoads: []Load{{MilliCPU: 1000, MemBytes: gib}}},
	}, {
		name:     "a pod fitting an existing node with room goes there and needs no new node",
		pending:  []*corev1.Pod{pod("new", 1000, gib)},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("running", 500, gib, on("n1"))},
		template: offer, maxNew: 10,
		want: Result{Placements: []Placement{{Pod: "app/new", Node: "n1"}}},
	}, {
		// Left to first-fit decreasing, l1 and s1 would share n1; nominated as an earlier
		// plan placed them when n2 was the first node, they stay where they were sent.
		name: "nominated pods stay on the node they were nominated to",
		pending: []*corev1.Pod{pod("s1", 600, gib), pod("s2", 600, gib, nominatedTo("n1")), pod("l1", 1200, gib, nominatedTo("n2")),
			pod("l2", 1200, gib, nominatedTo("n1"))},
		nodes:    []*corev1.Node{node("n1"), node("n2")},
		template: offer, maxNew: 10,
		want: Result{Placements: []Placement{{Pod: "app/l1", Node: "n2"}, {Pod: "app/l2", Node: "n1"},
			{Pod: "app/s1", Node: "n2"}, {Pod: "app/s2", Node: "n1"}}},
	}, {
		name: "two nominated to a node that takes one: the larger keeps it; a nomination to a node not given is not followed",
		pending: []*corev1.Pod{pod("big", 1500, gib, nominatedTo("n1")), pod("gone", 100, gib, nominatedTo("n9")),
			pod("second", 1000, gib, nominatedTo("n1"))},
		nodes:    []*corev1.Node{node("n1"), node("n2")},
		template: offer, maxNew: 10,
		want: Result{Placements: []Placement{{Pod: "app/big", Node: "n1"}, {Pod: "app/second", Node: "n2"},
			{Pod: "app/gone", Node: "n1"}}},
	}, {
		name:     "an existing node too full for the pod: a new one",
		pending:  []*corev1.Pod{pod("new", 1000, gib)},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("running", 1500, gib, on("n1"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/new", NewNode: 1}}},
	}, {
		name:     "anti-affinity to a running pod keeps the pod off its node",
		pending:  []*corev1.Pod{pod("b", 100, gib, labelled("app", "db"), antiAffine("app", "db"))},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("a", 100, gib, on("n1"), labelled("app", "db"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/b", NewNode: 1}}},
	}, {
		name:     "a nodeSelector no new node matches fits nowhere",
		pending:  []*corev1.Pod{pod("gpu", 100, gib, selecting("size", "gpu")), pod("std", 100, gib, selecting("size", "standard"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{
			{Pod: "app/gpu", Reason: "node(s) didn't match Pod's node affinity/selector"},
			{Pod: "app/std", NewNode: 1}}},
	}, {
		name:     "a taint of the new nodes the pod does not tolerate",
		pending:  []*corev1.Pod{pod("plain", 100, gib), pod("batch", 100, gib, tolerating("dedicated"))},
		template: tainted, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{
			{Pod: "app/batch", NewNode: 1},
			{Pod: "app/plain", Reason: "node(s) had untolerated taint(s)"}}},
	}, {
		name:     "a cordoned existing node takes nothing",
		pending:  []*corev1.Pod{pod("a", 100, gib)},
		nodes:    []*corev1.Node{cordoned(node("n1"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/a", NewNode: 1}}},
	}, {
		name:     "pods on the same host port get a node each",
		pending:  []*corev1.Pod{pod("a", 100, gib, hostPort(9000)), pod("b", 100, gib, hostPort(9000)), pod("c", 100, gib, hostPort(9001))},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("x", 100, gib, on("n1"), hostPort(9000))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 2, Placements: []Placement{
			{Pod: "app/a", NewNode: 1}, {Pod: "app/b", NewNode: 2}, {Pod: "app/c", Node: "n1"}}},
	}, {
		name: "anti-affinity across namespaces by namespaceSelector",
		pending: []*corev1.Pod{pod("b", 100, gib, func(p *corev1.Pod) {
			antiAffine("app", "db")(p)
			term := &p.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
			term.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: "other"}}
		})},
		nodes:    []*corev1.Node{node("n1")},
		bound:    []*corev1.Pod{pod("a", 100, gib, on("n1"), labelled("app", "db"), inNamespace("other"))},
		template: offer, maxNew: 10,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/b", NewNode: 1}}},
	}, {
		name: "hostname topology spread over the existing nodes",
		pending: []*corev1.Pod{
			pod("a", 100, gib, labelled("app", "web"), spread("app", "web")),
			pod("b", 100, gib, labelled("app", "web"), spread("app", "web")),
		},
		nodes:    []*corev1.Node{node("n1"), node("n2")},
		bound:    []*corev1.Pod{pod("x", 100, gib, on("n1"), labelled("app", "web"))},
		template: offer, maxNew: 10,
		want: Result{Placements: []Placement{{Pod: "app/a", Node: "n2"}, {Pod: "app/b", Node: "n1"}}},
	}, {
		name:     "pods beyond maxNew have no room",
		pending:  []*corev1.Pod{pod("a", 2000, gib), pod("b", 2000, gib), pod("c", 2000, gib)},
		template: offer, maxNew: 2,
		want: Result{NewNodes: 2, Placements: []Placement{
			{Pod: "app/a", NewNode: 1}, {Pod: "app/b", NewNode: 2}, {Pod: "app/c", Reason: ReasonNoRoom}}},
	}, {
		name:     "maxNew 0 still says what a pod lacks",
		pending:  []*corev1.Pod{pod("huge", 64000, gib), pod("a", 100, gib)},
		template: offer, maxNew: 0,
		want: Result{Placements: []Placement{{Pod: "app/huge", Reason: "Insufficient cpu"}, {Pod: "app/a", Reason: ReasonNoRoom}}},
	}, {
		name:     "nil pods and nodes are skipped, and pods of nodes not given",
		pending:  []*corev1.Pod{nil, pod("a", 100, gib, labelled("app", "db"), antiAffine("app", "db"), spread("app", "db"))},
		nodes:    []*corev1.Node{nil},
		bound:    []*corev1.Pod{nil, pod("ghost", 100, gib, on("gone"), labelled("app", "db"), antiAffine("app", "db"))},
		template: offer, maxNew: 1,
		want: Result{NewNodes: 1, Placements: []Placement{{Pod: "app/a", NewNode: 1}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Plan(tt.pending, tt.nodes, tt.bound, tt.template, tt.maxNew)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.NewNodeLoads) != got.NewNodes {
				t.Errorf("%d loads for %d new nodes", len(got.NewNodeLoads), got.NewNodes)
			}
			if tt.want.NewNodeLoads == nil {
				got.NewNodeLoads = nil
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Plan (-want +got):\n%s", diff)
			}
		})
	}
}

func cordoned(n *corev1.Node) *corev1.Node {
	n.Spec.Unschedulable = true
	return n
}

// TestPlanPlacementsPassFilters: on random pod sets, every placement Plan makes passes the
// filters again when the pod is checked against the final cluster (every other placed pod
// where Plan put it), and Plan never buys more nodes than there are pods.
func TestPlanPlacementsPassFilters(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	for round := range 30 {
		pending, nodes, bound := randomCluster(rng)
		maxNew := rng.Intn(len(pending) + 2)
		res, err := Plan(pending, nodes, bound, offer, maxNew)
		if err != nil {
			t.Fatal(err)
		}
		if res.NewNodes > len(pending) || res.NewNodes > maxNew {
			t.Fatalf("round %d: %d new nodes for %d pods (maxNew %d)", round, res.NewNodes, len(pending), maxNew)
		}
		if len(res.Placements) != len(pending) {
			t.Fatalf("round %d: %d placements for %d pods", round, len(res.Placements), len(pending))
		}
		byName := map[string]*corev1.Pod{}
		for _, p := range pending {
			byName[p.Namespace+"/"+p.Name] = p
		}
		final := append([]*corev1.Node(nil), nodes...)
		for k := 1; k <= res.NewNodes; k++ {
			final = append(final, offer.Node(NewNodeName(k)))
		}
		placedOn := map[string]string{}
		finalPods := append([]*corev1.Pod(nil), bound...)
		for _, pl := range res.Placements {
			switch {
			case pl.Node != "":
				placedOn[pl.Pod] = pl.Node
			case pl.NewNode > 0:
				placedOn[pl.Pod] = NewNodeName(pl.NewNode)
			default:
				continue
			}
			finalPods = append(finalPods, boundTo(byName[pl.Pod], placedOn[pl.Pod]))
		}
		for podName, nodeName := range placedOn {
			var others []*corev1.Pod
			for _, p := range finalPods {
				if p.Namespace+"/"+p.Name != podName {
					others = append(others, p)
				}
			}
			reason, err := check(byName[podName], final, others, nodeName)
			if err != nil {
				t.Fatal(err)
			}
			if reason != "" {
				t.Errorf("round %d: %s on %s rejected on re-check: %s", round, podName, nodeName, reason)
			}
		}
	}
}

// check runs the filters for pod on node with placed pods where they are, in a framework
// of its own: "" when it passes, else why not.
func check(pod *corev1.Pod, nodes []*corev1.Node, placed []*corev1.Pod, node string) (string, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sim, err := newSimulator(ctx)
	if err != nil {
		return "", err
	}
	sim.addNamespaces(placed)
	sim.addNamespaces([]*corev1.Pod{pod})
	return sim.fits(ctx, pod, nodes, placed, node), nil
}

// randomCluster is up to 3 existing nodes with a few bound pods, and up to 20 pending
// pods mixing sizes, anti-affinity, host ports, node selectors and tolerations.
func randomCluster(rng *rand.Rand) (pending []*corev1.Pod, nodes []*corev1.Node, bound []*corev1.Pod) {
	for i := range rng.Intn(4) {
		nodes = append(nodes, node(fmt.Sprintf("n%d", i)))
		for j := range rng.Intn(3) {
			bound = append(bound, pod(fmt.Sprintf("b%d-%d", i, j), int64(100*(1+rng.Intn(8))), int64(1+rng.Intn(2))*gib/2,
				on(nodes[i].Name), labelled("app", []string{"web", "db"}[rng.Intn(2)])))
		}
	}
	for i := range 1 + rng.Intn(20) {
		var opts []podOpt
		app := []string{"web", "db", "cache"}[rng.Intn(3)]
		opts = append(opts, labelled("app", app))
		if rng.Intn(4) == 0 {
			opts = append(opts, antiAffine("app", app))
		}
		if rng.Intn(6) == 0 {
			opts = append(opts, hostPort(int32(9000+rng.Intn(2))))
		}
		if rng.Intn(8) == 0 {
			opts = append(opts, selecting("size", []string{"standard", "gpu"}[rng.Intn(2)]))
		}
		cpu := int64(100 * (1 + rng.Intn(20)))
		if rng.Intn(15) == 0 {
			cpu = 64000
		}
		pending = append(pending, pod(fmt.Sprintf("p%02d", i), cpu, int64(1+rng.Intn(6))*gib/2, opts...))
	}
	return pending, nodes, bound
}

// TestPlanPacking logs how many nodes Plan buys for 50 pods of mixed requests against
// the bin-packing lower bound (the larger of total cpu and total memory over a node's,
// rounded up), for 20 seeds, with the mean and worst ratio. No node count below the bound
// is possible without overcommitting a node.
func TestPlanPacking(t *testing.T) {
	cpus := []int64{100, 250, 500, 750, 1000, 1500}
	mems := []int64{gib / 4, gib / 2, gib, 2 * gib}
	var sum, worst float64
	const seeds = 20
	for seed := int64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewSource(seed))
		var pending []*corev1.Pod
		var totalCPU, totalMem int64
		for i := range 50 {
			c, m := cpus[rng.Intn(len(cpus))], mems[rng.Intn(len(mems))]
			totalCPU += c
			totalMem += m
			pending = append(pending, pod(fmt.Sprintf("p%02d", i), c, m))
		}
		res, err := Plan(pending, nil, nil, offer, 100)
		if err != nil {
			t.Fatal(err)
		}
		if u := res.Unplaced(); len(u) > 0 {
			t.Fatalf("seed %d: unplaced: %v", seed, u)
		}
		bound := max(ceilDiv(totalCPU, offer.MilliCPU), ceilDiv(totalMem, offer.MemBytes))
		if res.NewNodes < int(bound) {
			t.Errorf("seed %d: %d nodes is below the lower bound %d: the plan overcommits", seed, res.NewNodes, bound)
		}
		ratio := float64(res.NewNodes) / float64(bound)
		sum += ratio
		worst = max(worst, ratio)
		t.Logf("seed %2d: %dm cpu, %d MiB: %d nodes bought, lower bound %d: %.2fx",
			seed, totalCPU, totalMem>>20, res.NewNodes, bound, ratio)
	}
	t.Logf("50 pods on 2-CPU 4-GiB nodes, %d seeds: mean %.3fx, worst %.2fx the lower bound", seeds, sum/seeds, worst)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// BenchmarkPlan is Plan for 50 pending pods of mixed requests on 3 existing nodes.
func BenchmarkPlan(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	var pending []*corev1.Pod
	for i := range 50 {
		pending = append(pending, pod(fmt.Sprintf("p%02d", i), int64(100*(1+rng.Intn(15))), int64(1+rng.Intn(4))*gib/2))
	}
	nodes := []*corev1.Node{node("n0"), node("n1"), node("n2")}
	for b.Loop() {
		if _, err := Plan(pending, nodes, nil, offer, 100); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanEmpty is the cost of building the framework alone.
func BenchmarkPlanEmpty(b *testing.B) {
	for b.Loop() {
		if _, err := Plan(nil, nil, nil, offer, 0); err != nil {
			b.Fatal(err)
		}
	}
}
