package nodehost

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/scale/simulate"
)

// ErrSizeUnknown: no node has joined, so the size and labels of the nodes this cluster rents
// are not known and the simulation cannot run; the slot counting decides.
var ErrSizeUnknown = errors.New("no node has joined yet: the size and labels of a rented node are not known")

// PlanInput is what the scheduling simulation (simulate.Plan) is given for one decision.
type PlanInput struct {
	// Pending are the pods the decision counts as pending: unbound, Unschedulable, not
	// finished, not daemon pods.
	Pending []*corev1.Pod
	// Nodes are the joined nodes whose claim is not being deleted, and a node of Template
	// for each claim in flight (not deleting, its node not joined), named as its node will
	// be: the capacity it brings counts, and nothing is rented twice for the same pods.
	// Each takes at most PodsPerNode pods besides its daemon pods; a joined node's
	// not-ready and unreachable taints, stale once it is Ready, are left out.
	Nodes []*corev1.Node
	// Bound are the pods with a node, not finished (daemon pods included: they use the
	// node's resources).
	Bound []*corev1.Pod
	// Template is a new node: the largest joined node's allocatable (every node of a cluster
	// is rented at the same contract size), PodsPerNode pods, the labels of the first joined
	// node by name less the ones naming that node, no taints.
	Template simulate.NodeTemplate
	// MaxNew is the room maxNodes leaves: maxNodes less the joined nodes and the claims
	// whose node has not joined (deleting ones included: they still exist), never below 0.
	MaxNew int
}

// PlanInputOf gathers the simulation's input from what the decision reads (InputOf); the
// error is ErrSizeUnknown while no node has joined.
func PlanInputOf(pods []*corev1.Pod, nodes []*corev1.Node, claims []*v1alpha1.NodeClaim, s Settings) (PlanInput, error) {
	perNode := max(s.PodsPerNode, 1)
	var joined []*corev1.Node
	joinedName := map[string]bool{}
	for _, n := range nodes {
		if n != nil && NodeJoined(n) {
			joined = append(joined, n)
			joinedName[n.Name] = true
		}
	}
	if len(joined) == 0 {
		return PlanInput{}, ErrSizeUnknown
	}

	var pi PlanInput
	daemons := map[string]int64{}
	for _, p := range pods {
		if p == nil {
			continue
		}
		sp := PodOf(p)
		switch {
		case sp.Finished:
		case sp.Node != "":
			pi.Bound = append(pi.Bound, p)
			if sp.Daemon {
				daemons[sp.Node]++
			}
		case sp.Unschedulable && !sp.Daemon:
			pi.Pending = append(pi.Pending, p)
		}
	}

	t := &pi.Template
	var maxPods int64
	for _, n := range joined {
		a := n.Status.Allocatable
		t.MilliCPU = max(t.MilliCPU, a.Cpu().MilliValue())
		t.MemBytes = max(t.MemBytes, a.Memory().Value())
		t.EphemeralStorageBytes = max(t.EphemeralStorageBytes, a.StorageEphemeral().Value())
		maxPods = max(maxPods, a.Pods().Value())
	}
	t.Pods = int64(perNode)
	if maxPods > 0 && maxPods < t.Pods {
		t.Pods = maxPods
	}
	t.Labels = newNodeTemplate(nodes).Labels
	delete(t.Labels, corev1.LabelHostname)

	deleting := map[string]bool{}
	for _, c := range claims {
		if c != nil && c.DeletionTimestamp != nil {
			deleting[c.Spec.NodeName] = true
		}
	}
	for _, n := range joined {
		if deleting[n.Name] {
			// Being released: cordoned, it takes no pod.
			continue
		}
		n = n.DeepCopy()
		// Ready True: the node lifecycle controller is about to lift its not-ready or
		// unreachable taint, and the scheduler will place pods there; counted with it the
		// node would take nothing and a new one be rented for the same pods.
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable
		})
		limit := int64(perNode) + daemons[n.Name]
		if have, ok := n.Status.Allocatable[corev1.ResourcePods]; !ok || have.Value() > limit {
			if n.Status.Allocatable == nil {
				n.Status.Allocatable = corev1.ResourceList{}
			}
			n.Status.Allocatable[corev1.ResourcePods] = *resource.NewQuantity(limit, resource.DecimalSI)
		}
		pi.Nodes = append(pi.Nodes, n)
	}
	total := len(joined)
	for _, c := range claims {
		if c == nil || joinedName[c.Spec.NodeName] {
			continue
		}
		total++
		if c.DeletionTimestamp != nil {
			continue
		}
		name := c.Spec.NodeName
		if name == "" {
			name = c.Name
		}
		n := t.Node(name)
		n.Status.Allocatable[corev1.ResourcePods] = *resource.NewQuantity(t.Pods+daemons[name], resource.DecimalSI)
		pi.Nodes = append(pi.Nodes, n)
	}
	pi.MaxNew = max(s.MaxNodes-total, 0)
	return pi, nil
}

// SimulationOf runs the simulation and turns its placements into the decision's facts: a pod
// on a node of pi.Nodes fits an existing node; one that fits nowhere is unplaced with the
// scheduler's reason, unless only maxNodes kept it from a new node (it still asks for one).
// The error is the scheduler framework failing to build.
func SimulationOf(pi PlanInput) (*scale.Simulation, error) {
	res, err := simulate.Plan(pi.Pending, pi.Nodes, pi.Bound, pi.Template, pi.MaxNew)
	if err != nil {
		return nil, fmt.Errorf("scheduling simulation: %w", err)
	}
	sim := &scale.Simulation{NewNodes: res.NewNodes}
	for _, pl := range res.Placements {
		switch {
		case pl.Node != "":
			sim.FitsExisting = append(sim.FitsExisting, pl.Pod)
		case pl.NewNode > 0, pl.Reason == simulate.ReasonNoRoom:
		default:
			if sim.Unplaced == nil {
				sim.Unplaced = map[string]string{}
			}
			sim.Unplaced[pl.Pod] = pl.Reason
		}
	}
	return sim, nil
}
