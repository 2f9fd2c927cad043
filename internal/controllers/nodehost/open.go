package nodehost

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// OpenDeadline is how long a Ready node stays closed (v1alpha1.TaintNodeUnregistered) while
// its nominations are outstanding: the scheduler clears a nomination on each failed try,
// and a node is not held closed by a loop of clearing and nominating again.
const OpenDeadline = 30 * time.Second

// OpenReadBack is how soon a pass that kept a node closed for its nominations looks again,
// to read them back (the node opens once they show): the pods' updates that this pass's
// nominations make are not sure to start another pass.
const OpenReadBack = time.Second

// NodesToOpen are the nodes whose TaintNodeUnregistered the node host lifts, sorted: each
// Ready node carrying it that no outstanding nomination names (every pending pod the plan
// placed there already shows it nominated there), or that has been Ready for OpenDeadline.
// recheck is how long until the first node kept closed reaches OpenDeadline (0: none is
// kept): nothing else may come to look again then, since a pod the scheduler failed on the
// closed node waits in its backoff without a change the node host would see.
//
// Why the taint: a node is tried by the scheduler as soon as it is Ready, and each failed
// try clears a pod's nomination (preemption finds nothing to preempt). A node registering
// NotReady makes every pending pod fail once, so the nominations are gone when it turns
// Ready, and the first pods in the scheduler's queue take the node whatever the plan
// said: two small pods fill a node the plan kept for a large one, which then fits nowhere.
// Closed until the nominations are back, the node's first try follows the plan.
func NodesToOpen(now time.Time, nodes []*corev1.Node, outstanding []Nomination) (open []string, recheck time.Duration) {
	waiting := map[string]bool{}
	for _, n := range outstanding {
		waiting[n.Node] = true
	}
	for _, n := range nodes {
		if n == nil || !unregistered(n) || !NodeJoined(n) {
			continue
		}
		left := OpenDeadline - now.Sub(readySince(n))
		if !waiting[n.Name] || left <= 0 {
			open = append(open, n.Name)
			continue
		}
		if recheck == 0 || left < recheck {
			recheck = left
		}
	}
	sort.Strings(open)
	return open, recheck
}

// unregistered reports whether n still carries TaintNodeUnregistered.
func unregistered(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, isUnregisteredTaint)
}

func isUnregisteredTaint(t corev1.Taint) bool { return t.Key == v1alpha1.TaintNodeUnregistered }

// open lifts TaintNodeUnregistered from each node named. The patch carries the node's
// resourceVersion, so a taint list changed meanwhile is not overwritten. A node not opened
// for a conflict or a failure (logged) makes again true: the caller looks again soon, since
// nothing else may start another pass (a kubelet's status update or this pass's own labels
// change the node without a change the watch wakes on).
func (r *Reconciler) open(ctx context.Context, p *pass, w *tenantWatch, nodes []*corev1.Node, names []string) (again bool) {
	byName := map[string]*corev1.Node{}
	for _, n := range nodes {
		byName[n.Name] = n
	}
	for _, name := range names {
		n := byName[name]
		if n == nil {
			continue
		}
		taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), isUnregisteredTaint)
		if taints == nil {
			taints = []corev1.Taint{}
		}
		patch, _ := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
			"spec":     map[string]any{"taints": taints},
		})
		_, err := w.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			r.Log.Info("nodehost_node_opened", "cluster", p.key.String(), "node", name)
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			again = true
		default:
			r.Log.Error("nodehost_open_failed", "cluster", p.key.String(), "node", name, "error", err.Error())
			again = true
		}
	}
	return again
}
