package nodehost

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// Which nodes a Cluster that consolidates when underutilized may drain: those whose pods fit
// on the others as they are, none of whose pods blocks a disruption, fewest pods first.
func TestConsolidatable(t *testing.T) {
	rs := ownedBy("ReplicaSet")
	nodes := func() []*corev1.Node {
		return []*corev1.Node{sized(node("n1", corev1.ConditionTrue), "2", "4Gi", "110"),
			sized(node("n2", corev1.ConditionTrue), "2", "4Gi", "110"), sized(node("n3", corev1.ConditionTrue), "2", "4Gi", "110")}
	}
	claims := []*v1alpha1.NodeClaim{claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false),
		claim("c-n2", "n2", v1alpha1.NodeClaimRunning, false), claim("c-n3", "n3", v1alpha1.NodeClaimRunning, false)}
	under := Settings{MaxNodes: 3, PodsPerNode: 10, Consolidation: v1alpha1.ConsolidateWhenUnderutilized}
	for _, tc := range []struct {
		name     string
		pods     []*corev1.Pod
		settings Settings
		nodes    func([]*corev1.Node)
		claims   []*v1alpha1.NodeClaim
		want     []string
	}{{
		name: "small pods on every node: fewest pods first, as many as fit on the rest together",
		pods: []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("500m"))), pod("b", all(onNode("n2"), rs, requesting("300m"))),
			pod("c", all(onNode("n2"), rs, requesting("300m"))), pod("d", all(onNode("n3"), rs, requesting("500m")))},
		settings: under, claims: claims, want: []string{"n1", "n3"},
	}, {
		name: "each node's pods fit on the others alone, not both at once: only the first",
		pods: []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("1"))), pod("b", all(onNode("n2"), rs, requesting("1"))),
			pod("c", all(onNode("n3"), rs, requesting("1500m")))},
		settings: under, claims: claims, want: []string{"n1"},
	}, {
		name:     "a budget of 0 drains none",
		pods:     []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("500m")))},
		settings: Settings{MaxNodes: 3, PodsPerNode: 10, Consolidation: v1alpha1.ConsolidateWhenUnderutilized, DisruptionBudget: "0"}, claims: claims,
	}, {
		name:     "0% of three nodes is none too",
		pods:     []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("500m")))},
		settings: Settings{MaxNodes: 3, PodsPerNode: 10, Consolidation: v1alpha1.ConsolidateWhenUnderutilized, DisruptionBudget: "0%"}, claims: claims,
	}, {
		name:     "WhenEmpty: none",
		pods:     []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("500m")))},
		settings: Settings{MaxNodes: 3, PodsPerNode: 10}, claims: claims,
	}, {
		name: "full nodes: no pod fits elsewhere",
		pods: []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting("1500m"))), pod("b", all(onNode("n2"), rs, requesting("1500m"))),
			pod("c", all(onNode("n3"), rs, requesting("1500m")))},
		settings: under, claims: claims,
	}, {
		name: "pods that block: do-not-disrupt, a Job's, a bare pod; empty nodes are not for consolidation",
		pods: []*corev1.Pod{pod("a", all(onNode("n1"), rs, func(p *corev1.Pod) {
			p.Annotations = map[string]string{v1alpha1.AnnotationDoNotDisrupt: "true"}
		})), pod("b", all(onNode("n2"), ownedBy("Job"))), pod("c", onNode("n3"))},
		settings: under, claims: claims,
	}, {
		name: "daemon pods neither block nor move; a node without a claim, or cordoned, is not drained",
		pods: []*corev1.Pod{pod("a", all(onNode("n1"), rs)), pod("d", all(onNode("n1"), ownedBy("DaemonSet"))),
			pod("b", all(onNode("n2"), rs)), pod("c", all(onNode("n3"), rs))},
		nodes:    func(ns []*corev1.Node) { ns[2].Spec.Unschedulable = true },
		settings: under, claims: claims[:1], want: []string{"n1"},
	}, {
		name:     "a pending pod: no consolidation",
		pods:     []*corev1.Pod{pod("a", all(onNode("n1"), rs)), pod("p", unschedulable)},
		settings: under, claims: claims,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := nodes()
			if tc.nodes != nil {
				tc.nodes(ns)
			}
			got, err := Consolidatable(tc.pods, ns, tc.claims, tc.settings)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%v, want %v", got, tc.want)
			}
		})
	}
}

// A budget is a count or a percentage of the cluster's nodes rounded up, as Karpenter's.
func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		budget string
		nodes  int
		want   int
	}{
		{"", 1, 1}, {"", 10, 1}, {"", 11, 2}, {"", 0, 0},
		{"0", 5, 0}, {"3", 1, 3}, {"50%", 3, 2}, {"100%", 4, 4}, {"0%", 9, 0},
		{"not a budget", 10, 1}, {"-2", 10, 1},
	} {
		if got := (Settings{DisruptionBudget: tc.budget}).Budget(tc.nodes); got != tc.want {
			t.Errorf("budget %q of %d nodes = %d, want %d", tc.budget, tc.nodes, got, tc.want)
		}
	}
}
