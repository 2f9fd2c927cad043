package simulate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	schedmetrics "k8s.io/kubernetes/pkg/scheduler/metrics"
)

// filterPlugins are the scheduler plugins Plan runs, at PreFilter and Filter, in this
// order (the package doc says what each covers).
var filterPlugins = []string{
	names.NodeUnschedulable,
	names.NodeName,
	names.TaintToleration,
	names.NodeAffinity,
	names.NodePorts,
	names.NodeResourcesFit,
	names.PodTopologySpread,
	names.InterPodAffinity,
}

// DefaultMaxPods is what a new node offers in pods when NodeTemplate.Pods is 0: the
// kubelet's default maxPods.
const DefaultMaxPods = 110

// ReasonNoRoom is the reason of a pod a new node could run when maxNew nodes are in use
// already.
const ReasonNoRoom = "no room within maxNodes"

// NodeTemplate is a node of the size on offer, as a new one would register: its
// allocatable and the labels and taints every node of its kind gets.
type NodeTemplate struct {
	MilliCPU int64
	MemBytes int64
	// EphemeralStorageBytes is its allocatable ephemeral storage; 0 offers none (a pod
	// asking for some then fits no new node).
	EphemeralStorageBytes int64
	// Pods is how many pods it runs; 0 is DefaultMaxPods.
	Pods int64
	// Labels of the kind; kubernetes.io/hostname is set per node (Node's name), whatever
	// it says here.
	Labels map[string]string
	Taints []corev1.Taint
}

// Node is the node t describes, named name (its hostname label too).
func (t NodeTemplate) Node(name string) *corev1.Node {
	labels := make(map[string]string, len(t.Labels)+1)
	for k, v := range t.Labels {
		labels[k] = v
	}
	labels[corev1.LabelHostname] = name
	pods := t.Pods
	if pods <= 0 {
		pods = DefaultMaxPods
	}
	alloc := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(max(t.MilliCPU, 0), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(max(t.MemBytes, 0), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(pods, resource.DecimalSI),
	}
	if t.EphemeralStorageBytes > 0 {
		alloc[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(t.EphemeralStorageBytes, resource.BinarySI)
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: slices.Clone(t.Taints)},
		Status:     corev1.NodeStatus{Capacity: alloc.DeepCopy(), Allocatable: alloc},
	}
}

// NewNodeName is the name of hypothetical node k (from 1) in the simulation: not a valid
// node name, so it cannot be one the cluster has.
func NewNodeName(k int) string { return "(new node " + strconv.Itoa(k) + ")" }

// Placement is where Plan put one pending pod.
type Placement struct {
	// Pod is namespace/name.
	Pod string
	// Node is the existing node it goes on; "" otherwise.
	Node string
	// NewNode is the hypothetical node (from 1) it goes on; 0 otherwise.
	NewNode int
	// Reason says why it fits nowhere (the filter's message for a new node, or
	// ReasonNoRoom); "" when placed.
	Reason string
}

// Placed says whether the pod found a node, existing or new.
func (p Placement) Placed() bool { return p.Node != "" || p.NewNode > 0 }

// Result is what Plan found.
type Result struct {
	// Placements has one entry per pending pod, in the order Plan placed them (larger
	// requests first).
	Placements []Placement
	// NewNodes is how many hypothetical nodes the placed pods use (at most maxNew).
	NewNodes int
	// NewNodeLoads are the summed requests of the pods placed on each new node, index k-1
	// for new node k: what the node must hold, the basis of its size.
	NewNodeLoads []Load
}

// Load is the CPU and memory requests of the pods on a node.
type Load struct {
	MilliCPU int64
	MemBytes int64
}

// add is l with pod's requests (containers, init containers, overhead, as the scheduler
// counts them).
func (l Load) add(pod *corev1.Pod) Load {
	req := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return Load{MilliCPU: l.MilliCPU + req.Cpu().MilliValue(), MemBytes: l.MemBytes + req.Memory().Value()}
}

// Unplaced are the placements of the pods that fit nowhere.
func (r Result) Unplaced() []Placement {
	var out []Placement
	for _, p := range r.Placements {
		if !p.Placed() {
			out = append(out, p)
		}
	}
	return out
}

// Plan places the pending pods on nodes (with the bound pods on them) and, when none
// passes, on up to maxNew new nodes of template, as the package doc says. Nil pods and
// nodes are skipped, and so is a bound pod of a node not given (the scheduler's snapshot
// holds no pod of a node it does not know). The error is the framework failing to
// build (a plugin's configuration), never the input.
func Plan(pending []*corev1.Pod, nodes []*corev1.Node, bound []*corev1.Pod, template NodeTemplate, maxNew int) (Result, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // stops the framework's metrics recorder
	sim, err := newSimulator(ctx)
	if err != nil {
		return Result{}, err
	}

	var cluster []*corev1.Node
	for _, n := range nodes {
		if n != nil {
			cluster = append(cluster, n)
		}
	}
	slices.SortFunc(cluster, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
	placed := onNodes(bound, cluster)
	sim.addNamespaces(placed)
	order := sortedPending(pending, template)
	sim.addNamespaces(order)

	// Nominated pods first, each on its nominated node when it passes there: the scheduler
	// tries that node first and holds its room, and a plan that re-packed them would move
	// nominations the scheduler already acts on.
	nominated := map[*corev1.Pod]string{}
	for _, p := range order {
		n := p.Status.NominatedNodeName
		if n == "" || !slices.ContainsFunc(cluster, func(c *corev1.Node) bool { return c.Name == n }) {
			continue
		}
		if sim.fits(ctx, p, cluster, placed, n) == "" {
			nominated[p] = n
			placed = append(placed, boundTo(p, n))
		}
	}

	var res Result
	for _, p := range order {
		pl := Placement{Pod: p.Namespace + "/" + p.Name}
		if name, ok := nominated[p]; ok {
			pl.Node = name
			res.Placements = append(res.Placements, pl)
			continue
		}
		if name := sim.firstFit(ctx, p, cluster, placed); name != "" {
			placed = append(placed, boundTo(p, name))
			if k := newNodeIndex(cluster, name); k > 0 {
				pl.NewNode = k
				res.NewNodeLoads[k-1] = res.NewNodeLoads[k-1].add(p)
			} else {
				pl.Node = name
			}
			res.Placements = append(res.Placements, pl)
			continue
		}
		// No node there passes: would a new one? Asked even when none may be added, so
		// that the reason says what the pod lacks rather than that room ran out.
		fresh := template.Node(NewNodeName(res.NewNodes + 1))
		withFresh := append(slices.Clip(cluster), fresh)
		reason := sim.fits(ctx, p, withFresh, placed, fresh.Name)
		switch {
		case reason != "":
			pl.Reason = reason
		case res.NewNodes >= maxNew:
			pl.Reason = ReasonNoRoom
		default:
			res.NewNodes++
			res.NewNodeLoads = append(res.NewNodeLoads, Load{}.add(p))
			cluster = withFresh
			placed = append(placed, boundTo(p, fresh.Name))
			pl.NewNode = res.NewNodes
		}
		res.Placements = append(res.Placements, pl)
	}
	return res, nil
}

// onNodes are the non-nil pods bound to one of nodes: the scheduler's snapshot holds no
// pod of a node it does not know.
func onNodes(pods []*corev1.Pod, nodes []*corev1.Node) []*corev1.Pod {
	known := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		known[n.Name] = true
	}
	var out []*corev1.Pod
	for _, p := range pods {
		if p != nil && known[p.Spec.NodeName] {
			out = append(out, p)
		}
	}
	return out
}

// simulator is a scheduler framework with the filters of Filters, reading the snapshot
// its lister holds.
type simulator struct {
	fw         framework.Framework
	lister     *snapshotLister
	informers  informers.SharedInformerFactory
	namespaces map[string]bool
}

// snapshotLister is the framework's view of the cluster: the plugins keep the lister they
// were built with, so a new snapshot is swapped in behind it.
type snapshotLister struct{ *cache.Snapshot }

func newSimulator(ctx context.Context) (*simulator, error) {
	// The framework counts plugin evaluations in the scheduler's metrics, which must exist
	// first. Register is once per process and is what an in-process kube-scheduler calls
	// too, so the two share them.
	schedmetrics.Register()
	cfg, err := latest.Default()
	if err != nil {
		return nil, fmt.Errorf("scheduler defaults: %w", err)
	}
	if len(cfg.Profiles) == 0 {
		return nil, fmt.Errorf("scheduler defaults: no profile")
	}
	profile := cfg.Profiles[0]
	enabled := make([]config.Plugin, 0, len(filterPlugins))
	for _, name := range filterPlugins {
		enabled = append(enabled, config.Plugin{Name: name})
	}
	profile.Plugins = &config.Plugins{
		// The framework insists on a queue sort and a binder; neither runs here.
		QueueSort: config.PluginSet{Enabled: []config.Plugin{{Name: names.PrioritySort}}},
		Bind:      config.PluginSet{Enabled: []config.Plugin{{Name: names.DefaultBinder}}},
		PreFilter: config.PluginSet{Enabled: enabled},
		Filter:    config.PluginSet{Enabled: enabled},
	}
	lister := &snapshotLister{Snapshot: cache.NewEmptySnapshot()}
	// Never started: the listers read only what addNamespaces puts in. No client is
	// needed for that.
	inf := informers.NewSharedInformerFactory(nil, 0)
	fw, err := runtime.NewFramework(ctx, plugins.NewInTreeRegistry(), &profile,
		runtime.WithSnapshotSharedLister(lister),
		runtime.WithInformerFactory(inf),
	)
	if err != nil {
		return nil, fmt.Errorf("scheduler framework: %w", err)
	}
	return &simulator{fw: fw, lister: lister, informers: inf, namespaces: map[string]bool{}}, nil
}

// addNamespaces makes the namespaces of pods known to InterPodAffinity's namespace
// selectors, with the label the API server gives every namespace.
func (s *simulator) addNamespaces(pods []*corev1.Pod) {
	store := s.informers.Core().V1().Namespaces().Informer().GetStore()
	for _, p := range pods {
		if s.namespaces[p.Namespace] {
			continue
		}
		s.namespaces[p.Namespace] = true
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.Namespace,
			Labels: map[string]string{corev1.LabelMetadataName: p.Namespace}}}
		_ = store.Add(ns) // a namespace object always has a key
	}
}

// firstFit is the first of nodes (in order) where pod passes the filters with placed
// pods where they are, or "".
func (s *simulator) firstFit(ctx context.Context, pod *corev1.Pod, nodes []*corev1.Node, placed []*corev1.Pod) string {
	s.lister.Snapshot = cache.NewSnapshot(placed, nodes)
	state := framework.NewCycleState()
	pre, st, _ := s.fw.RunPreFilterPlugins(ctx, state, pod)
	if !st.IsSuccess() {
		return ""
	}
	for _, n := range nodes {
		if !pre.AllNodes() && !pre.NodeNames.Has(n.Name) {
			continue
		}
		info, err := s.lister.Get(n.Name)
		if err != nil {
			continue
		}
		if s.fw.RunFilterPlugins(ctx, state, pod, info).IsSuccess() {
			return n.Name
		}
	}
	return ""
}

// fits runs PreFilter and Filter for pod on the node named node, one of nodes: "" when
// it passes, else the message of the plugin that rejected it.
func (s *simulator) fits(ctx context.Context, pod *corev1.Pod, nodes []*corev1.Node, placed []*corev1.Pod, node string) string {
	s.lister.Snapshot = cache.NewSnapshot(placed, nodes)
	state := framework.NewCycleState()
	pre, st, _ := s.fw.RunPreFilterPlugins(ctx, state, pod)
	if !st.IsSuccess() {
		return st.Message()
	}
	if !pre.AllNodes() && !pre.NodeNames.Has(node) {
		// What the scheduler records for a node its PreFilter result leaves out.
		return "node is filtered out by the prefilter result"
	}
	info, err := s.lister.Get(node)
	if err != nil {
		return err.Error()
	}
	if st := s.fw.RunFilterPlugins(ctx, state, pod, info); !st.IsSuccess() {
		return st.Message()
	}
	return ""
}

// sortedPending are the non-nil pending pods, larger requests first: by the larger of
// their shares of a new node's cpu and memory (the resource that fills a node first), then
// cpu, memory and namespace/name, so that the same pods give the same plan.
func sortedPending(pending []*corev1.Pod, t NodeTemplate) []*corev1.Pod {
	type keyed struct {
		pod      *corev1.Pod
		share    float64
		cpu, mem int64
	}
	var ks []keyed
	for _, p := range pending {
		if p == nil {
			continue
		}
		req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
		k := keyed{pod: p, cpu: req.Cpu().MilliValue(), mem: req.Memory().Value()}
		if t.MilliCPU > 0 {
			k.share = float64(k.cpu) / float64(t.MilliCPU)
		}
		if t.MemBytes > 0 {
			k.share = max(k.share, float64(k.mem)/float64(t.MemBytes))
		}
		ks = append(ks, k)
	}
	slices.SortStableFunc(ks, func(a, b keyed) int {
		return cmp.Or(cmp.Compare(b.share, a.share), cmp.Compare(b.cpu, a.cpu), cmp.Compare(b.mem, a.mem),
			cmp.Compare(a.pod.Namespace, b.pod.Namespace), cmp.Compare(a.pod.Name, b.pod.Name))
	})
	out := make([]*corev1.Pod, len(ks))
	for i, k := range ks {
		out[i] = k.pod
	}
	return out
}

// boundTo is a copy of pod bound to node, as the snapshot holds a placed pod.
func boundTo(pod *corev1.Pod, node string) *corev1.Pod {
	p := pod.DeepCopy()
	p.Spec.NodeName = node
	if p.UID == "" {
		p.UID = types.UID(p.Namespace + "/" + p.Name)
	}
	return p
}

// newNodeIndex is k when name is NewNodeName(k) of a node in nodes, else 0.
func newNodeIndex(nodes []*corev1.Node, name string) int {
	for k := 1; k <= len(nodes); k++ {
		if NewNodeName(k) == name {
			return k
		}
	}
	return 0
}
