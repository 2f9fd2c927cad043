package nodehost

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// onHost is a node selector for one hostname, as a local-path volume's node affinity is.
func onHost(name string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{name}}}}}}
}

// volumes is a tenant with claims (namespace default) bound to volumes on hosts.
type volumes struct {
	claims map[string]*corev1.PersistentVolumeClaim
	pvs    map[string]*corev1.PersistentVolume
}

func newVolumes() *volumes {
	return &volumes{claims: map[string]*corev1.PersistentVolumeClaim{}, pvs: map[string]*corev1.PersistentVolume{}}
}

// bind adds claim bound to volume pv, on host ("": no node affinity; pv "": not bound).
func (v *volumes) bind(claim, pv, host string) {
	v.claims[claim] = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: claim},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: pv}}
	if pv == "" {
		return
	}
	v.pvs[pv] = &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}}
	if host != "" {
		v.pvs[pv].Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: onHost(host)}
	}
}

func (v *volumes) claim(namespace, name string) *corev1.PersistentVolumeClaim {
	if namespace != "default" {
		return nil
	}
	return v.claims[name]
}

func (v *volumes) volume(name string) *corev1.PersistentVolume { return v.pvs[name] }

func mounting(claims ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, c := range claims {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c,
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
		}
	}
}

func TestVolumeAffinity(t *testing.T) {
	v := newVolumes()
	v.bind("data", "pvc-1", "n1")
	v.bind("cache", "pvc-2", "n1")
	v.bind("waiting", "", "")     // WaitForFirstConsumer: not bound yet
	v.bind("remote", "pvc-3", "") // a volume any node reaches
	for _, c := range []struct {
		name   string
		claims []string
		want   *corev1.NodeSelector
		pv     string
	}{
		{"a local volume holds the pod to its node", []string{"data"}, onHost("n1"), "pvc-1"},
		{"a claim not bound yet adds nothing", []string{"waiting"}, nil, ""},
		{"a volume without node affinity adds nothing", []string{"remote"}, nil, ""},
		{"a claim that is not there adds nothing", []string{"gone"}, nil, ""},
		{"two local volumes: both", []string{"remote", "data", "cache"},
			&corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: append(onHost("n1").NodeSelectorTerms[0].MatchExpressions,
				onHost("n1").NodeSelectorTerms[0].MatchExpressions...)}}}, "pvc-1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			sel, pv := VolumeAffinity(pod("p", mounting(c.claims...)), v.claim, v.volume)
			if d := cmp.Diff(c.want, sel); d != "" || pv != c.pv {
				t.Errorf("volume %q, want %q; selector (-want +got)\n%s", pv, c.pv, d)
			}
		})
	}
}

// The pod's own required node affinity is kept: a node must match one of its terms and the
// volume's.
func TestWithVolumeAffinity(t *testing.T) {
	zones := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}}}}
	p := pod("p", func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: zones}}
	})
	got := WithVolumeAffinity(p, onHost("n1")).Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	host := onHost("n1").NodeSelectorTerms[0].MatchExpressions[0]
	want := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
		{MatchExpressions: []corev1.NodeSelectorRequirement{zones.NodeSelectorTerms[0].MatchExpressions[0], host}},
		{MatchExpressions: []corev1.NodeSelectorRequirement{zones.NodeSelectorTerms[1].MatchExpressions[0], host}}}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got)\n%s", d)
	}
	if len(p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions) != 1 {
		t.Error("the pod given was changed")
	}
	if WithVolumeAffinity(p, nil) != p {
		t.Error("no volume affinity: the pod itself, not a copy")
	}
	if bare := WithVolumeAffinity(pod("bare", nil), onHost("n1")); cmp.Diff(onHost("n1"), bare.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != "" {
		t.Errorf("a pod with no affinity: %+v", bare.Spec.Affinity)
	}
}

// What the decision weighs with volumes: a pending pod whose volume's node is gone fits no
// node and rents none (the scheduler's NodeAffinity reason, named with the volume); a node
// holding a volume's pod is not drained for consolidation, and the others still are.
func TestVolumesHoldPodsToTheirNode(t *testing.T) {
	hosted := func(n *corev1.Node) *corev1.Node {
		n.Labels = map[string]string{corev1.LabelHostname: n.Name}
		return n
	}
	v := newVolumes()
	v.bind("lost", "pvc-lost", "gone")
	v.bind("data", "pvc-data", "n1")
	n1 := hosted(sized(node("n1", corev1.ConditionTrue), "2", "4Gi", "110"))
	n2 := hosted(sized(node("n2", corev1.ConditionTrue), "2", "4Gi", "110"))
	claims := []*v1alpha1.NodeClaim{claim("c-n1", "n1", v1alpha1.NodeClaimRunning, false), claim("c-n2", "n2", v1alpha1.NodeClaimRunning, false)}
	pvcs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	pvs := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, c := range v.claims {
		_ = pvcs.Add(c)
	}
	for _, pv := range v.pvs {
		_ = pvs.Add(pv)
	}
	w := &tenantWatch{claims: listersv1.NewPersistentVolumeClaimLister(pvcs), volumes: listersv1.NewPersistentVolumeLister(pvs)}
	hold := w.withVolumes

	pending, held := hold([]*corev1.Pod{pod("orphan", all(unschedulable, requesting("100m"), mounting("lost")))})
	sim, err := SimulationOf(PlanInputOf(pending, []*corev1.Node{n1, n2}, claims, Settings{MaxNodes: 4, PodsPerNode: 10}))
	if err != nil {
		t.Fatal(err)
	}
	why, ok := sim.Unplaced["default/orphan"]
	if !ok || sim.NewNodes != 0 || held["default/orphan"] != "pvc-lost" {
		t.Fatalf("orphan: unplaced %v (%q), %d new nodes, held by %q; want unplaced, none, pvc-lost", ok, why, sim.NewNodes, held["default/orphan"])
	}
	t.Logf("orphan: %s", volumeReason(held["default/orphan"], why))

	rs := ownedBy("ReplicaSet")
	bound, _ := hold([]*corev1.Pod{pod("db", all(onNode("n1"), rs, requesting("100m"), mounting("data"))),
		pod("web", all(onNode("n2"), rs, requesting("100m")))})
	under := Settings{MaxNodes: 2, PodsPerNode: 10, Consolidation: v1alpha1.ConsolidateWhenUnderutilized, DisruptionBudget: "2"}
	got, err := Consolidatable(bound, []*corev1.Node{n1, n2}, claims, under)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"n2"}) {
		t.Errorf("consolidatable %v, want n2 only: db's data is on n1", got)
	}
}
