package nodehost

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func pod(name string, mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	if mod != nil {
		mod(p)
	}
	return p
}

func unschedulable(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, LastTransitionTime: metav1.NewTime(t0)}}
}

func ownedBy(kind string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: "o", UID: "u", Controller: &yes}}
	}
}

func all(mods ...func(*corev1.Pod)) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, m := range mods {
			m(p)
		}
	}
}

func TestPodOf(t *testing.T) {
	now := metav1.NewTime(t0)
	cases := []struct {
		name string
		pod  *corev1.Pod
		want scale.Pod
	}{
		{"a new pod the scheduler has not looked at", pod("a", nil), scale.Pod{Name: "default/a"}},
		{"pending as Unschedulable", pod("a", unschedulable), scale.Pod{Name: "default/a", Unschedulable: true, PendingSince: t0}},
		{"PodScheduled False for another reason", pod("a", func(p *corev1.Pod) {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "SchedulingGated"}}
		}), scale.Pod{Name: "default/a"}},
		{"bound", pod("a", func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodRunning }),
			scale.Pod{Name: "default/a", Node: "n1"}},
		{"bound but with a stale Unschedulable condition", pod("a", all(unschedulable, func(p *corev1.Pod) { p.Spec.NodeName = "n1" })),
			scale.Pod{Name: "default/a", Node: "n1"}},
		{"succeeded", pod("a", func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.Status.Phase = corev1.PodSucceeded }),
			scale.Pod{Name: "default/a", Node: "n1", Finished: true}},
		{"failed while unbound", pod("a", all(unschedulable, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })),
			scale.Pod{Name: "default/a", Finished: true}},
		{"deleting while unbound asks for nothing", pod("a", all(unschedulable, func(p *corev1.Pod) { p.DeletionTimestamp = &now })),
			scale.Pod{Name: "default/a", Finished: true}},
		{"deleting while bound still holds its node", pod("a", func(p *corev1.Pod) { p.Spec.NodeName = "n1"; p.DeletionTimestamp = &now }),
			scale.Pod{Name: "default/a", Node: "n1"}},
		{"a DaemonSet's pod", pod("a", all(unschedulable, ownedBy("DaemonSet"))),
			scale.Pod{Name: "default/a", Daemon: true, Unschedulable: true, PendingSince: t0}},
		{"a mirror pod", pod("a", func(p *corev1.Pod) {
			p.Annotations = map[string]string{mirrorPodAnnotation: "x"}
			p.Spec.NodeName = "n1"
		}),
			scale.Pod{Name: "default/a", Node: "n1", Daemon: true}},
		{"a Job's pod", pod("a", all(unschedulable, ownedBy("Job"))),
			scale.Pod{Name: "default/a", Job: true, Unschedulable: true, PendingSince: t0}},
		{"a ReplicaSet's pod is neither", pod("a", all(unschedulable, ownedBy("ReplicaSet"))),
			scale.Pod{Name: "default/a", Unschedulable: true, PendingSince: t0}},
		{"an owner that is not the controller does not count", pod("a", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "DaemonSet", Name: "o", UID: "u"}}
		}), scale.Pod{Name: "default/a"}},
		{"an empty pod never panics", &corev1.Pod{}, scale.Pod{Name: "/"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, PodOf(tc.pod)); d != "" {
				t.Errorf("(-want +got)\n%s", d)
			}
		})
	}
}

func node(name string, ready corev1.ConditionStatus) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
			{Type: corev1.NodeReady, Status: ready, LastTransitionTime: metav1.NewTime(t0.Add(-3 * time.Second))}}
	}
	return n
}

func TestNodeJoined(t *testing.T) {
	for _, tc := range []struct {
		node *corev1.Node
		want bool
	}{
		{node("a", corev1.ConditionTrue), true},
		{node("a", corev1.ConditionFalse), false},
		{node("a", corev1.ConditionUnknown), false},
		{node("a", ""), false},
	} {
		if got := NodeJoined(tc.node); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.node.Status.Conditions, got, tc.want)
		}
	}
}

func claim(name, node string, phase v1alpha1.NodeClaimPhase, deleting bool) *v1alpha1.NodeClaim {
	c := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "c"}, NodeName: node}, Status: v1alpha1.NodeClaimStatus{Phase: phase}}
	if deleting {
		now := metav1.NewTime(t0)
		c.DeletionTimestamp = &now
	}
	return c
}

func TestInputOf(t *testing.T) {
	st := scale.State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Minute)}}
	s := Settings{MaxNodes: 3, PodsPerNode: 2, Hold: time.Minute, BatchIdle: time.Second, BatchMax: 5 * time.Second}
	got := InputOf(t0,
		[]*corev1.Pod{pod("p", unschedulable), nil, pod("q", func(p *corev1.Pod) { p.Spec.NodeName = "n1" })},
		[]*corev1.Node{node("n1", corev1.ConditionTrue), node("n2", corev1.ConditionFalse), nil},
		[]*v1alpha1.NodeClaim{claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false), claim("c-n2", "n2", v1alpha1.NodeClaimJoining, false),
			claim("c-n3", "n3", v1alpha1.NodeClaimBidding, true), claim("c-n4", "n4", v1alpha1.NodeClaimFailed, false),
			claim("c-n5", "n5", v1alpha1.NodeClaimLost, false), nil},
		s, st)
	want := scale.Input{Now: t0, MaxNodes: 3, PodsPerNode: 2, Hold: time.Minute, BatchIdle: time.Second, BatchMax: 5 * time.Second, State: st,
		Pods:  []scale.Pod{{Name: "default/p", Unschedulable: true, PendingSince: t0}, {Name: "default/q", Node: "n1"}},
		Nodes: []scale.Node{{Name: "n1", ReadySince: t0.Add(-3 * time.Second)}},
		Claims: []scale.Claim{{Name: "c-n1", NodeName: "n1"}, {Name: "c-n2", NodeName: "n2"},
			{Name: "c-n3", NodeName: "n3", Deleting: true}, {Name: "c-n4", NodeName: "n4"}, {Name: "c-n5", NodeName: "n5"}},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
}

func TestSettingsOf(t *testing.T) {
	for _, tc := range []struct {
		spec v1alpha1.ClusterSpec
		want Settings
	}{
		{v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 8, ScaleHold: metav1.Duration{Duration: time.Minute}}, Settings{MaxNodes: 4, PodsPerNode: 8, Hold: time.Minute}},
		{v1alpha1.ClusterSpec{}, Settings{MaxNodes: 0, PodsPerNode: 1}},
		{v1alpha1.ClusterSpec{MaxNodes: -1, PodsPerNode: -3, ScaleHold: metav1.Duration{Duration: -time.Second}}, Settings{PodsPerNode: 1}},
	} {
		if got := SettingsOf(&v1alpha1.Cluster{Spec: tc.spec}); got != tc.want {
			t.Errorf("%+v: %+v, want %+v", tc.spec, got, tc.want)
		}
	}
}

func TestNodesOf(t *testing.T) {
	claims := []*v1alpha1.NodeClaim{claim("a", "n1", v1alpha1.NodeClaimRunning, false), claim("b", "n2", v1alpha1.NodeClaimRunning, true),
		claim("c", "n3", v1alpha1.NodeClaimJoining, false), claim("d", "n4", v1alpha1.NodeClaimLost, false)}
	if got := nodesOf(claims, map[string]bool{"n1": true, "n2": true, "n4": true, "unclaimed": true}); got != 1 {
		t.Errorf("nodes %d, want 1 (only the Ready node of a live claim)", got)
	}
}

func TestClaimName(t *testing.T) {
	long := strings.Repeat("a", 250)
	for _, tc := range []struct{ cluster, node, want string }{
		{"web", "node-0123456789", "web-node-0123456789"},
		{long, "node-0123456789", strings.Repeat("a", 253-16) + "-node-0123456789"},
		{strings.Repeat("a", 236) + "-x", "node-0123456789", strings.Repeat("a", 236) + "-node-0123456789"},
		{strings.Repeat("a", 236) + ".x", "node-0123456789", strings.Repeat("a", 236) + "-node-0123456789"},
		{"", "node-0123456789", "node-0123456789"},
	} {
		got := ClaimName(tc.cluster, tc.node)
		if got != tc.want {
			t.Errorf("ClaimName(%.20q..., %q) = %q, want %q", tc.cluster, tc.node, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("%q is not an object name: %v", got, errs)
		}
	}
}

func TestNewNodeName(t *testing.T) {
	re := regexp.MustCompile(`^node-[0-9a-f]{10}$`)
	seen := map[string]bool{}
	for i := 0; i < 100; i++ {
		n, err := NewNodeName()
		if err != nil {
			t.Fatal(err)
		}
		if !re.MatchString(n) || seen[n] {
			t.Fatalf("node name %q (seen before: %v)", n, seen[n])
		}
		seen[n] = true
	}
}

func TestConditionReason(t *testing.T) {
	valid := regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)
	for in, want := range map[string]string{
		scale.ReasonIntentNoNode:     "IntentAndNoNode",
		scale.ReasonBatching:         "BatchingPendingPods",
		scale.ReasonAtMax:            "AtMaxNodes",
		scale.ReasonNoNodesAllowed:   "MaxNodesIs0",
		scale.ReasonEmptyPastHold:    "EmptyPastHold",
		scale.ReasonReleaseUnclaimed: "EmptyNodesHaveNoClaimToRelease",
		"":                           "Unknown",
		"  -- ":                      "Unknown",
		"0 nodes":                    "N0Nodes",
		"héllo wörld":                "HLloWRld",
	} {
		got := ConditionReason(in)
		if got != want {
			t.Errorf("ConditionReason(%q) = %q, want %q", in, got, want)
		}
		if !valid.MatchString(got) {
			t.Errorf("ConditionReason(%q) = %q is not a valid condition reason", in, got)
		}
	}
}

// A pod's requests are what the scheduler places it by (its largest init container when that
// is larger than its containers together, plus overhead); a new node offers what the
// largest joined node's allocatable does.
func TestInputOfSizes(t *testing.T) {
	rl := func(cpu, mem string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}
	}
	p := pod("p", func(p *corev1.Pod) {
		unschedulable(p)
		p.Spec.Containers = []corev1.Container{{Name: "a", Resources: rl("100m", "64Mi")}, {Name: "b", Resources: rl("200m", "64Mi")}}
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: rl("250m", "512Mi")}}
		p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}
	})
	small, large := node("n1", corev1.ConditionTrue), node("n2", corev1.ConditionTrue)
	small.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1"), corev1.ResourceMemory: resource.MustParse("256Mi")}
	large.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("128Mi")}
	notReady := node("n3", corev1.ConditionFalse)
	notReady.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}
	in := InputOf(t0, []*corev1.Pod{p}, []*corev1.Node{small, large, notReady}, nil, Settings{MaxNodes: 3, PodsPerNode: 1}, scale.State{})
	if want := (scale.Resources{MilliCPU: 310, MemBytes: 512 << 20}); in.Pods[0].Requests != want {
		t.Errorf("requests %+v, want %+v (containers 300m, init 512Mi, overhead 10m)", in.Pods[0].Requests, want)
	}
	if want := (scale.Resources{MilliCPU: 2000, MemBytes: 256 << 20}); in.NodeSize != want {
		t.Errorf("node size %+v, want %+v (the joined nodes' largest, each resource)", in.NodeSize, want)
	}
}

// A pending pod whose node selector or required node affinity no new node of the cluster
// would match (read from a joined node's labels, less the ones naming that node) is marked:
// renting cannot help it. Before a node has joined nothing is known and nothing is marked.
func TestInputOfNoNewNode(t *testing.T) {
	joined := node("node-a", corev1.ConditionTrue)
	joined.Labels = map[string]string{corev1.LabelArchStable: "amd64", corev1.LabelHostname: "node-a", ClaimLabel: "c-node-a",
		"socialweb.computer/user-namespaces": "true"}
	selecting := func(name string, sel map[string]string) *corev1.Pod {
		return pod(name, func(p *corev1.Pod) { unschedulable(p); p.Spec.NodeSelector = sel })
	}
	pods := []*corev1.Pod{
		selecting("any", nil),
		selecting("amd64", map[string]string{corev1.LabelArchStable: "amd64"}),
		selecting("userns", map[string]string{"socialweb.computer/user-namespaces": "true"}),
		selecting("ssd", map[string]string{"disktype": "ssd"}),
		selecting("arm", map[string]string{corev1.LabelArchStable: "arm64"}),
		selecting("pinned", map[string]string{corev1.LabelHostname: "node-a"}),
		pod("affinity", func(p *corev1.Pod) {
			unschedulable(p)
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: []string{"s390x"}}}}}}}}
		}),
	}
	in := InputOf(t0, pods, []*corev1.Node{joined}, nil, Settings{MaxNodes: 3, PodsPerNode: 1}, scale.State{})
	for _, p := range in.Pods {
		marked := p.NoNewNode != ""
		want := map[string]bool{"default/ssd": true, "default/arm": true, "default/pinned": true, "default/affinity": true}[p.Name]
		if marked != want {
			t.Errorf("%s: NoNewNode %q, want marked %v", p.Name, p.NoNewNode, want)
		}
	}
	in = InputOf(t0, pods, nil, nil, Settings{MaxNodes: 3, PodsPerNode: 1}, scale.State{})
	for _, p := range in.Pods {
		if p.NoNewNode != "" {
			t.Errorf("%s marked %q with no node joined", p.Name, p.NoNewNode)
		}
	}
}
