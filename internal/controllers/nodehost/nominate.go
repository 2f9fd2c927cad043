package nodehost

import (
	"context"
	"encoding/json"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"socialweb.computer/internal/scale"
)

// Nomination is one pending pod to nominate to the node the simulation placed it on.
type Nomination struct {
	Pod  string // namespace/name
	Node string
}

// Nominations are the pending pods whose status.nominatedNodeName should name the node the
// decision's simulation placed them on and does not yet: the pods it placed on a node the
// cluster has or a claim in flight brings, and those it placed on each new node, for the
// nodes just claimed (provisioned, in the order of d.Sizes; fewer when a quota cut them).
//
// Why: the simulation packs pods first-fit onto nodes rented at the size of what it packed;
// kube-scheduler alone scores nodes and spreads pods over the emptiest, so on the same nodes
// it leaves pods without room and they ask for more nodes (simulate's
// TestPlanUnderKubeSchedulersOwnChoice counts them). The scheduler tries a pod's nominated
// node first and counts the pods nominated to a node against its room when it places
// others there (NominatedNodeNameForExpectation, Karpenter's and Cluster Autoscaler's hint).
// A pod it cannot place yet (its node has not registered) may lose the nomination; the next
// decision nominates it again.
func Nominations(in scale.Input, d scale.Decision, provisioned []string) []Nomination {
	if in.Simulated == nil {
		return nil
	}
	want := map[string]string{}
	for pod, node := range in.Simulated.OnNodes {
		want[pod] = node
	}
	for i, node := range provisioned {
		if i >= len(d.NewNodePods) {
			break
		}
		for _, pod := range d.NewNodePods[i] {
			want[pod] = node
		}
	}
	var out []Nomination
	for _, p := range in.Pods {
		node, ok := want[p.Name]
		if !ok || p.Node != "" || p.Finished || !p.Unschedulable || p.Nominated == node {
			continue
		}
		out = append(out, Nomination{Pod: p.Name, Node: node})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pod < out[j].Pod })
	return out
}

// nominate sets each pod's status.nominatedNodeName. A failure is logged and left for the
// next decision: a nomination is a hint to the scheduler, and the pod gets a node without it.
func (r *Reconciler) nominate(ctx context.Context, p *pass, w *tenantWatch, ns []Nomination) {
	failed := 0
	var done []string
	for _, n := range ns {
		namespace, name, ok := strings.Cut(n.Pod, "/")
		if !ok {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"status": map[string]string{"nominatedNodeName": n.Node}})
		_, err := w.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		if err != nil && !apierrors.IsNotFound(err) {
			failed++
			r.Log.Error("nodehost_nominate_failed", "cluster", p.key.String(), "pod", n.Pod, "node", n.Node, "error", err.Error())
			continue
		}
		done = append(done, n.Pod+"="+n.Node)
	}
	if len(ns) > 0 {
		r.Log.Info("nodehost_nominated", "cluster", p.key.String(), "pods", len(ns)-failed, "failed", failed, "nominations", done)
	}
}
