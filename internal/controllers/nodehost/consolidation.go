package nodehost

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/scale/simulate"
)

// AnnotationDraining marks a tenant node the node host cordoned to consolidate it away: once
// its pods are gone it is released at once.
const AnnotationDraining = "socialweb.computer/draining"

// nodeDraining says whether the node host cordoned n for consolidation.
func nodeDraining(n *corev1.Node) bool {
	return n.Spec.Unschedulable && n.Annotations[AnnotationDraining] == "true"
}

// disruptionBlocker says why p keeps its node from being drained, or "": a pod annotated
// do-not-disrupt, a Job's pod (it would start over), a pod no controller owns (nothing would
// make it again).
func disruptionBlocker(p *corev1.Pod) string {
	if p.Annotations[v1alpha1.AnnotationDoNotDisrupt] == "true" {
		return "annotated " + v1alpha1.AnnotationDoNotDisrupt
	}
	c := metav1.GetControllerOfNoCopy(p)
	switch {
	case c == nil:
		return "owned by no controller"
	case c.Kind == "Job":
		return "a Job's pod"
	}
	return ""
}

// Consolidatable are the nodes a Cluster that consolidates when underutilized may drain
// together, best first (fewest pods to move, then by name): joined, claimed (its claim not
// deleting), not cordoned, running at least one pod besides daemon pods and none that
// blocks a disruption. Each is taken in turn when the scheduling simulation places the pods
// of it and of every node taken before it on the remaining nodes as they are (no new node),
// so that the pods of all of them fit at once, and any of them can be drained together
// (fewer nodes moving leaves more room for the pods that do). Nil when the Cluster
// consolidates only empty nodes, its disruption budget allows none, or a pod is pending.
// The error is the scheduler framework failing to build.
func Consolidatable(pods []*corev1.Pod, nodes []*corev1.Node, claims []*v1alpha1.NodeClaim, s Settings) ([]string, error) {
	if s.Consolidation != v1alpha1.ConsolidateWhenUnderutilized || anyPending(pods) || DrainBudget(claims, s) <= 0 {
		return nil, nil
	}
	cands := consolidationCandidates(pods, nodes, claims)
	if len(cands) == 0 {
		return nil, nil
	}
	pi := PlanInputOf(pods, nodes, claims, s)
	var out []string
	for _, c := range cands {
		taken := append(slices.Clone(out), c.name)
		res, err := planWithout(pi, cands, taken, 0)
		if err != nil {
			return nil, err
		}
		if len(res.Unplaced()) == 0 && res.NewNodes == 0 {
			out = taken
		}
	}
	return out, nil
}

// candidate is a node consolidation may take away: its name, the pods that would move, and
// its claim.
type candidate struct {
	name  string
	pods  []*corev1.Pod
	claim *v1alpha1.NodeClaim
}

// consolidationCandidates are the nodes consolidation may take away, best first (fewest
// pods to move, then by name): joined, claimed (its claim not deleting), not cordoned,
// running at least one pod besides daemon pods and none that blocks a disruption.
func consolidationCandidates(pods []*corev1.Pod, nodes []*corev1.Node, claims []*v1alpha1.NodeClaim) []candidate {
	claimOf := map[string]*v1alpha1.NodeClaim{}
	for _, c := range claims {
		if c != nil && c.DeletionTimestamp == nil {
			claimOf[c.Spec.NodeName] = c
		}
	}
	movable := map[string][]*corev1.Pod{}
	blocked := map[string]bool{}
	for _, p := range pods {
		if p == nil || p.Spec.NodeName == "" {
			continue
		}
		sp := PodOf(p)
		if sp.Finished || sp.Daemon || p.DeletionTimestamp != nil {
			continue
		}
		if disruptionBlocker(p) != "" {
			blocked[p.Spec.NodeName] = true
			continue
		}
		movable[p.Spec.NodeName] = append(movable[p.Spec.NodeName], p)
	}
	var cands []candidate
	for _, n := range nodes {
		if n == nil || !NodeJoined(n) || n.Spec.Unschedulable || claimOf[n.Name] == nil || blocked[n.Name] || len(movable[n.Name]) == 0 {
			continue
		}
		c := claimOf[n.Name]
		cands = append(cands, candidate{n.Name, movable[n.Name], c})
	}
	slices.SortFunc(cands, func(a, b candidate) int {
		return cmp.Or(cmp.Compare(len(a.pods), len(b.pods)), cmp.Compare(a.name, b.name))
	})
	return cands
}

// planWithout simulates the pods of the candidates named taken moving off their nodes: onto
// the other nodes as they are (cordoned ones left out), and at most maxNew new nodes.
func planWithout(pi PlanInput, cands []candidate, taken []string, maxNew int) (simulate.Result, error) {
	others := slices.DeleteFunc(slices.Clone(pi.Nodes), func(n *corev1.Node) bool { return slices.Contains(taken, n.Name) || n.Spec.Unschedulable })
	bound := slices.DeleteFunc(slices.Clone(pi.Bound), func(p *corev1.Pod) bool { return slices.Contains(taken, p.Spec.NodeName) })
	var moving []*corev1.Pod
	for _, c := range cands {
		if !slices.Contains(taken, c.name) {
			continue
		}
		for _, p := range c.pods {
			p = p.DeepCopy()
			p.Spec.NodeName = ""
			moving = append(moving, p)
		}
	}
	res, err := simulate.Plan(moving, others, bound, pi.Template, maxNew)
	if err != nil {
		return simulate.Result{}, fmt.Errorf("scheduling simulation: %w", err)
	}
	return res, nil
}

// maxReplaced bounds the nodes one replacement takes away (and the simulations a decision
// runs to find them).
const maxReplaced = 16

// Replaceable is the largest set of nodes a Cluster that consolidates when underutilized
// may replace with one new node for less than they cost together (Karpenter's
// consolidation by replacement): the first k candidates (consolidationCandidates' order),
// k from the most the disruption budget allows down to two, whose pods the simulation
// places on the other nodes and exactly one new node. Only nodes with a price (their
// claim's winning bid, not free) in the currency of the first such candidate are
// candidates: nothing replaces a free node for less. The new node is sized as a scale-up
// sizes one, and capped at their total price less one, so the market rents it only when a
// bid makes it cheaper. Nil when the Cluster consolidates only empty nodes, its budget
// allows fewer than two nodes at once, a pod is pending, or no set qualifies. The error is
// the scheduler framework failing to build.
func Replaceable(pods []*corev1.Pod, nodes []*corev1.Node, claims []*v1alpha1.NodeClaim, s Settings) (*scale.Replacement, error) {
	budget := DrainBudget(claims, s)
	if s.Consolidation != v1alpha1.ConsolidateWhenUnderutilized || budget < 2 || anyPending(pods) {
		return nil, nil
	}
	var cands []candidate
	currency := ""
	for _, c := range consolidationCandidates(pods, nodes, claims) {
		pr := c.claim.Status.Price
		if pr == nil || pr.Cost <= 0 || pr.Currency == "" {
			continue
		}
		if currency == "" {
			currency = pr.Currency
		}
		if pr.Currency == currency {
			cands = append(cands, c)
		}
	}
	if len(cands) < 2 {
		return nil, nil
	}
	pi := PlanInputOf(pods, nodes, claims, s)
	for k := min(len(cands), budget, maxReplaced); k >= 2; k-- {
		taken := make([]string, k)
		var total int64
		for i, c := range cands[:k] {
			taken[i] = c.name
			total += c.claim.Status.Price.Cost
		}
		res, err := planWithout(pi, cands, taken, 1)
		if err != nil {
			return nil, err
		}
		if len(res.Unplaced()) > 0 || res.NewNodes != 1 {
			continue
		}
		l := res.NewNodeLoads[0]
		size, ok := pi.Sizes.Fit(scale.Resources{MilliCPU: l.MilliCPU + pi.Overhead.MilliCPU, MemBytes: l.MemBytes + pi.Overhead.MemBytes})
		if !ok {
			continue
		}
		slices.Sort(taken)
		return &scale.Replacement{Nodes: taken, Size: size, MaxPrice: scale.Price{Cost: total - 1, Currency: currency}}, nil
	}
	return nil, nil
}

// DrainBudget is how many nodes the cluster may drain at once: its disruption budget of
// the nodes it rents (its claims not being deleted).
func DrainBudget(claims []*v1alpha1.NodeClaim, s Settings) int {
	live := 0
	for _, c := range claims {
		if c != nil && c.DeletionTimestamp == nil {
			live++
		}
	}
	return s.Budget(live)
}

// drained is what one round of a node's drain left: how many of its pods are still to go,
// and why the Eviction API refused the ones it refused (pod: reason).
type drained struct {
	left    int
	refused []string
}

func (d *drained) add(o drained) {
	d.left += o.left
	d.refused = append(d.refused, o.refused...)
}

// String says what is left in the words of the Scaling condition: "1 pod(s) to move;
// eviction refused: default/web-0: Cannot evict pod ... (The disruption budget web needs 2
// healthy pods and has 2 currently)", the first refusals only.
func (d drained) String() string {
	s := fmt.Sprintf("%d pod(s) to move", d.left)
	if len(d.refused) == 0 {
		return s
	}
	const shown = 3
	parts := d.refused[:min(len(d.refused), shown)]
	s += "; eviction refused: " + strings.Join(parts, "; ")
	if n := len(d.refused) - shown; n > 0 {
		s += fmt.Sprintf("; and %d more", n)
	}
	return s
}

// evictionRefusal says why the Eviction API refused an eviction (429): the server's message
// and, for a PodDisruptionBudget, the cause naming the budget and what it needs.
func evictionRefusal(err error) string {
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return err.Error()
	}
	st := se.Status()
	msg := st.Message
	if st.Details != nil {
		var causes []string
		for _, c := range st.Details.Causes {
			if c.Message != "" {
				causes = append(causes, c.Message)
			}
		}
		if len(causes) > 0 {
			msg += " (" + strings.Join(causes, "; ") + ")"
		}
	}
	return msg
}

// ReasonDisruptionBlocked is the reason of the Warning Event on a pod whose eviction for a
// consolidation the Eviction API refused (a PodDisruptionBudget allows no disruption now).
const ReasonDisruptionBlocked = "DisruptionBlocked"

// drain cordons node and marks it draining, then asks the Eviction API to evict each of its
// pods but daemon pods (a PodDisruptionBudget that allows no disruption now refuses; the
// next decision asks again). It says how many pods are left to go and why evictions were
// refused, and records a Warning Event on a refused pod when the reason is new.
func drain(ctx context.Context, w *tenantWatch, node string) (drained, error) {
	patch := []byte(`{"metadata":{"annotations":{"` + AnnotationDraining + `":"true"}},"spec":{"unschedulable":true}}`)
	if _, err := w.client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return drained{}, nil
		}
		return drained{}, fmt.Errorf("cordoning node %s: %w", node, err)
	}
	pods, err := w.pods.List(labels.Everything())
	if err != nil {
		return drained{}, err
	}
	var out drained
	var errs []error
	for _, p := range pods {
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		if sp := PodOf(p); sp.Finished || sp.Daemon {
			continue
		}
		out.left++
		ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
		err := w.client.PolicyV1().Evictions(p.Namespace).Evict(ctx, ev)
		switch {
		case err == nil, apierrors.IsNotFound(err):
			delete(w.blocked, p.Namespace+"/"+p.Name) // it goes: nothing more to say of it
		case apierrors.IsTooManyRequests(err):
			// A PodDisruptionBudget allows no disruption now.
			why := evictionRefusal(err)
			out.refused = append(out.refused, p.Namespace+"/"+p.Name+": "+why)
			w.reportBlocked(p, node, why)
		default:
			errs = append(errs, fmt.Errorf("evicting %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return out, errors.Join(errs...)
}

// reportBlocked records a Warning Event DisruptionBlocked on p when why is not the reason
// its last one gave.
func (w *tenantWatch) reportBlocked(p *corev1.Pod, node, why string) {
	if w.events == nil {
		return
	}
	key := p.Namespace + "/" + p.Name
	if w.blocked[key] == why {
		return
	}
	if w.blocked == nil {
		w.blocked = map[string]string{}
	}
	w.blocked[key] = why
	w.events.Eventf(p, corev1.EventTypeWarning, ReasonDisruptionBlocked,
		"eviction to consolidate node %s refused: %s", node, why)
}
