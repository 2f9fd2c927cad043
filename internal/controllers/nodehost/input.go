package nodehost

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
)

// mirrorPodAnnotation marks the API's copy of a static pod: like a daemon pod it belongs
// to one node and neither asks for a node nor keeps one.
const mirrorPodAnnotation = "kubernetes.io/config.mirror"

// PodOf is what the scale decision needs of a tenant pod.
//
//   - Unschedulable: Pending, not bound, and PodScheduled False with reason Unschedulable
//     (the scheduler looked and found no node); PendingSince is that condition's
//     lastTransitionTime (to the second; RefinePendingSince narrows it).
//   - Finished: Succeeded or Failed, or being deleted while unbound (it will not run).
//   - Daemon: controlled by a DaemonSet, or a mirror pod.
//   - Job: controlled by a Job.
func PodOf(p *corev1.Pod) scale.Pod {
	out := scale.Pod{Name: p.Namespace + "/" + p.Name, Node: p.Spec.NodeName, Nominated: p.Status.NominatedNodeName}
	// What the scheduler places it by: containers, init containers, overhead.
	req := resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{})
	out.Requests = scale.Resources{MilliCPU: req.Cpu().MilliValue(), MemBytes: req.Memory().Value()}
	switch p.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		out.Finished = true
	}
	if p.DeletionTimestamp != nil && p.Spec.NodeName == "" {
		out.Finished = true
	}
	if c := metav1.GetControllerOfNoCopy(p); c != nil {
		switch c.Kind {
		case "DaemonSet":
			out.Daemon = true
		case "Job":
			out.Job = true
		}
	}
	if _, ok := p.Annotations[mirrorPodAnnotation]; ok {
		out.Daemon = true
	}
	if p.Spec.NodeName == "" && !out.Finished && (p.Status.Phase == corev1.PodPending || p.Status.Phase == "") {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				out.Unschedulable = true
				out.PendingSince = c.LastTransitionTime.Time
			}
		}
	}
	return out
}

// NodeJoined says whether a tenant Node counts as joined for the decision: registered with
// condition Ready True. A registered node that is not Ready takes no pods; while it has a
// claim, the claim counts as in flight (its capacity is counted once, never released
// mid-join).
func NodeJoined(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// readySince is when a Ready node's Ready condition became True.
func readySince(n *corev1.Node) time.Time {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// ClaimOf is what the decision needs of a NodeClaim.
func ClaimOf(c *v1alpha1.NodeClaim) scale.Claim {
	return scale.Claim{Name: c.Name, NodeName: c.Spec.NodeName, Deleting: c.DeletionTimestamp != nil, Replaces: c.Spec.Replaces}
}

// ClaimEnded says whether a claim will never give (or give back) a node: Failed or Lost.
// The node host deletes such a claim after a retry delay, so that a node still needed is
// claimed again without a claim per reconcile while the market keeps failing.
func ClaimEnded(c *v1alpha1.NodeClaim) bool {
	return c.Status.Phase == v1alpha1.NodeClaimFailed || c.Status.Phase == v1alpha1.NodeClaimLost
}

// Settings are the Cluster's scale settings with the node host's batching.
type Settings struct {
	MaxNodes, PodsPerNode int
	Hold                  time.Duration
	BatchIdle, BatchMax   time.Duration
	// NodeSize is the Cluster's spec.nodeSize; nil is the default range.
	NodeSize *v1alpha1.NodeSizeRange
	// Consolidation is the Cluster's spec.consolidationPolicy ("" is WhenEmpty).
	Consolidation v1alpha1.ConsolidationPolicy
	// DisruptionBudget is the Cluster's spec.disruptionBudget ("" is DefaultDisruptionBudget).
	DisruptionBudget string
	// Arch is the Cluster's spec.nodeArch: every new node's kubernetes.io/arch ("": not
	// required, a new node is taken to be like the nodes there are).
	Arch string
}

// DefaultDisruptionBudget is the budget of a Cluster that states none, as Karpenter's.
const DefaultDisruptionBudget = "10%"

// Budget is how many of nodes the cluster may drain at once: the budget's count, or its
// percentage of nodes rounded up. A budget the API server would not have admitted is the
// default.
func (s Settings) Budget(nodes int) int {
	b := s.DisruptionBudget
	if b == "" {
		b = DefaultDisruptionBudget
	}
	v := intstr.Parse(b)
	n, err := intstr.GetScaledValueFromIntOrPercent(&v, nodes, true)
	if err != nil || n < 0 {
		v = intstr.Parse(DefaultDisruptionBudget)
		n, _ = intstr.GetScaledValueFromIntOrPercent(&v, nodes, true)
	}
	return n
}

// SizeRange is the range of sizes the cluster rents nodes at: spec.nodeSize, each bound it
// leaves unset from scale.DefaultSizeRange, a maximum below its minimum raised to it.
func (s Settings) SizeRange() scale.SizeRange {
	r := scale.DefaultSizeRange
	if ns := s.NodeSize; ns != nil {
		if ns.MinCPUs > 0 {
			r.Min.CPUs = ns.MinCPUs
		}
		if ns.MaxCPUs > 0 {
			r.Max.CPUs = ns.MaxCPUs
		}
		if ns.MinMemMiB > 0 {
			r.Min.MemMiB = ns.MinMemMiB
		}
		if ns.MaxMemMiB > 0 {
			r.Max.MemMiB = ns.MaxMemMiB
		}
	}
	r.Max.CPUs = max(r.Max.CPUs, r.Min.CPUs)
	r.Max.MemMiB = max(r.Max.MemMiB, r.Min.MemMiB)
	return r
}

// SettingsOf reads a Cluster's spec: maxNodes (negative is 0), podsPerNode (under 1 is 1),
// scaleHold (negative is 0). The API server defaults and bounds them; these are for objects
// written elsewhere.
func SettingsOf(c *v1alpha1.Cluster) Settings {
	s := Settings{MaxNodes: int(c.Spec.MaxNodes), PodsPerNode: int(c.Spec.PodsPerNode), Hold: c.Spec.ScaleHold.Duration,
		NodeSize: c.Spec.NodeSize.DeepCopy(), Consolidation: c.Spec.ConsolidationPolicy, DisruptionBudget: c.Spec.DisruptionBudget,
		Arch: c.Spec.NodeArch}
	if s.MaxNodes < 0 {
		s.MaxNodes = 0
	}
	if s.PodsPerNode < 1 {
		s.PodsPerNode = 1
	}
	if s.Hold < 0 {
		s.Hold = 0
	}
	return s
}

// InputOf is the decision's input: every pod, the joined nodes, the claims, the settings,
// the time and the state the previous decision returned. A claim that ended stays in until
// it is deleted: it holds its place (and maxNodes) through the retry delay.
func InputOf(now time.Time, pods []*corev1.Pod, nodes []*corev1.Node, claims []*v1alpha1.NodeClaim, s Settings, st scale.State) scale.Input {
	in := scale.Input{Now: now, MaxNodes: s.MaxNodes, PodsPerNode: s.PodsPerNode, Hold: s.Hold,
		BatchIdle: s.BatchIdle, BatchMax: s.BatchMax, State: st}
	for _, p := range pods {
		if p != nil {
			in.Pods = append(in.Pods, PodOf(p))
		}
	}
	for _, n := range nodes {
		if n != nil && NodeJoined(n) {
			since := readySince(n)
			if unregistered(n) {
				// Closed to the scheduler until the node host opens it (open.go): its free
				// slots count for the pending pods until it has been open a while.
				since = now
			}
			in.Nodes = append(in.Nodes, scale.Node{Name: n.Name, ReadySince: since, Draining: nodeDraining(n)})
			// A new node offers what the largest joined one does: every node of a
			// cluster is rented by the same contract size.
			in.NodeSize.MilliCPU = max(in.NodeSize.MilliCPU, n.Status.Allocatable.Cpu().MilliValue())
			in.NodeSize.MemBytes = max(in.NodeSize.MemBytes, n.Status.Allocatable.Memory().Value())
		}
	}
	for _, c := range claims {
		if c != nil {
			in.Claims = append(in.Claims, ClaimOf(c))
		}
	}
	if tmpl := newNodeTemplate(nodes, s.Arch); tmpl != nil {
		i := 0
		for _, p := range pods {
			if p == nil {
				continue
			}
			if in.Pods[i].Unschedulable {
				in.Pods[i].NoNewNode = noNewNode(p, tmpl)
			}
			i++
		}
	}
	return in
}

// Labels a node gets for itself, not for its kind: a new node has its own.
var perNodeLabels = []string{corev1.LabelHostname, ClaimLabel}

// newNodeTemplate is what a new node of this cluster looks like to a pod's node selector
// and required node affinity: the labels of a joined node (the first by name; every node
// of a cluster is rented from the same contract) without the ones that name that node.
// nil when no node has joined: nothing is known yet.
func newNodeTemplate(nodes []*corev1.Node, arch string) *corev1.Node {
	var first *corev1.Node
	for _, n := range nodes {
		if n != nil && NodeJoined(n) && (first == nil || n.Name < first.Name) {
			first = n
		}
	}
	if first == nil {
		return nil
	}
	labels := map[string]string{}
	for k, v := range first.Labels {
		labels[k] = v
	}
	for _, k := range perNodeLabels {
		delete(labels, k)
	}
	labels[corev1.LabelHostname] = "(a new node)"
	if arch != "" {
		labels[corev1.LabelArchStable] = arch
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "(a new node)", Labels: labels}}
}

// noNewNode says why no node like tmpl could run p (its nodeSelector or required node
// affinity, as the scheduler's NodeAffinity filter reads them), or "".
func noNewNode(p *corev1.Pod, tmpl *corev1.Node) string {
	ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(tmpl)
	switch {
	case err != nil:
		return "its node affinity cannot be read: " + err.Error()
	case !ok:
		return "its node selector or required node affinity matches no node this cluster rents"
	}
	return ""
}
