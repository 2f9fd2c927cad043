package nodehost

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
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

// Which nodes one new node may replace for less: the most the budget allows, fewest pods
// first, whose pods fit on the rest and exactly one new node, priced in one currency.
func TestReplaceable(t *testing.T) {
	rs := ownedBy("ReplicaSet")
	nodes := func() []*corev1.Node {
		return []*corev1.Node{sized(node("n1", corev1.ConditionTrue), "1", "1Gi", "110"),
			sized(node("n2", corev1.ConditionTrue), "1", "1Gi", "110"), sized(node("n3", corev1.ConditionTrue), "1", "1Gi", "110")}
	}
	priced := func(name, node string, cost int64, currency string) *v1alpha1.NodeClaim {
		c := claim(name, node, v1alpha1.NodeClaimRunning, false)
		c.Status.Price = &v1alpha1.NodeClaimPrice{Cost: cost, Currency: currency}
		return c
	}
	claims := []*v1alpha1.NodeClaim{priced("c-n1", "n1", 110, "USD"), priced("c-n2", "n2", 110, "USD"), priced("c-n3", "n3", 110, "USD")}
	with := func(budget string) Settings {
		return Settings{MaxNodes: 4, PodsPerNode: 10, Consolidation: v1alpha1.ConsolidateWhenUnderutilized, DisruptionBudget: budget}
	}
	each := func(cpu string) []*corev1.Pod {
		return []*corev1.Pod{pod("a", all(onNode("n1"), rs, requesting(cpu))), pod("b", all(onNode("n2"), rs, requesting(cpu))),
			pod("c", all(onNode("n3"), rs, requesting(cpu)))}
	}
	for _, tc := range []struct {
		name     string
		pods     []*corev1.Pod
		settings Settings
		claims   []*v1alpha1.NodeClaim
		want     *scale.Replacement
	}{{
		name: "three nodes a pod each that none of the others holds: one 2-CPU node for all three",
		pods: each("600m"), settings: with("3"), claims: claims,
		want: &scale.Replacement{Nodes: []string{"n1", "n2", "n3"}, Size: scale.Size{CPUs: 2, MemMiB: 256}, MaxPrice: scale.Price{Cost: 329, Currency: "USD"}},
	}, {
		name: "a budget of two: the first two",
		pods: each("600m"), settings: with("2"), claims: claims,
		want: &scale.Replacement{Nodes: []string{"n1", "n2"}, Size: scale.Size{CPUs: 2, MemMiB: 256}, MaxPrice: scale.Price{Cost: 219, Currency: "USD"}},
	}, {
		name: "three do not fit one node of the largest size: two do",
		pods: each("900m"), settings: with("3"), claims: claims,
		want: &scale.Replacement{Nodes: []string{"n1", "n2"}, Size: scale.Size{CPUs: 2, MemMiB: 256}, MaxPrice: scale.Price{Cost: 219, Currency: "USD"}},
	}, {
		name: "a free node is never replaced",
		pods: each("600m"), settings: with("3"), claims: []*v1alpha1.NodeClaim{priced("c-n1", "n1", 0, ""), claims[1], claims[2]},
		want: &scale.Replacement{Nodes: []string{"n2", "n3"}, Size: scale.Size{CPUs: 2, MemMiB: 256}, MaxPrice: scale.Price{Cost: 219, Currency: "USD"}},
	}, {
		name: "prices in two currencies: only the first candidate's",
		pods: each("600m"), settings: with("3"), claims: []*v1alpha1.NodeClaim{claims[0], priced("c-n2", "n2", 90, "EUR"), claims[2]},
		want: &scale.Replacement{Nodes: []string{"n1", "n3"}, Size: scale.Size{CPUs: 2, MemMiB: 256}, MaxPrice: scale.Price{Cost: 219, Currency: "USD"}},
	}, {
		name: "no price known: nothing",
		pods: each("600m"), settings: with("3"),
		claims: []*v1alpha1.NodeClaim{claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false), claim("c-n2", "n2", v1alpha1.NodeClaimRunning, false)},
	}, {
		name: "pods that fit on the other nodes: a drain, not a replacement",
		pods: each("300m"), settings: with("2"), claims: claims,
	}, {
		name: "a budget of one: nothing",
		pods: each("600m"), settings: with("1"), claims: claims,
	}, {
		name: "WhenEmpty: nothing",
		pods: each("600m"), settings: Settings{MaxNodes: 4, PodsPerNode: 10, DisruptionBudget: "3"}, claims: claims,
	}, {
		name: "a pending pod: nothing",
		pods: append(each("600m"), pod("p", unschedulable)), settings: with("3"), claims: claims,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Replaceable(tc.pods, nodes(), tc.claims, tc.settings)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Replaceable (-want +got):\n%s", diff)
			}
		})
	}
}
