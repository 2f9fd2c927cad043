package nodehost

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/utils/ptr"

	"socialweb.computer/internal/scale"
)

// A pending pod's controller tells whether more pods are on their way: a ReplicaSet with
// as many pods as its replicas has made all it will make until something changes. The batch
// of pending pods then need not wait Karpenter's idle second for them (scale.SettledIdle).

// WantedPods is how many live pods a controller wants now: a ReplicaSet its replicas; a
// StatefulSet its replicas, or 1 under OrderedReady (it makes the next pod once the one
// before is running and ready); a Job its parallelism, capped by the completions it still
// needs. ok is false for any other object and for a controller being deleted.
func WantedPods(obj metav1.Object) (n int, ok bool) {
	if obj.GetDeletionTimestamp() != nil {
		return 0, false
	}
	one := func(p *int32) int { return int(ptr.Deref(p, 1)) }
	switch o := obj.(type) {
	case *appsv1.ReplicaSet:
		return one(o.Spec.Replicas), true
	case *appsv1.StatefulSet:
		if o.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
			return min(one(o.Spec.Replicas), 1), true
		}
		return one(o.Spec.Replicas), true
	case *batchv1.Job:
		if o.Spec.Suspend != nil && *o.Spec.Suspend {
			return 0, true
		}
		n := one(o.Spec.Parallelism)
		if o.Spec.Completions != nil {
			n = min(n, int(*o.Spec.Completions-o.Status.Succeeded))
		}
		return max(n, 0), true
	}
	return 0, false
}

// OwnersSettled returns the controllers (by UID) of wanted that are settled: they have at
// least the pods they want, counting live ones (not finished, not being deleted), and the
// scheduler has tried each of their unbound pods (it is Unschedulable).
func OwnersSettled(pods []*corev1.Pod, wanted map[types.UID]int) map[types.UID]bool {
	live := map[types.UID]int{}
	untried := map[types.UID]bool{}
	for _, p := range pods {
		if p == nil {
			continue
		}
		c := metav1.GetControllerOfNoCopy(p)
		if c == nil {
			continue
		}
		if _, ok := wanted[c.UID]; !ok {
			continue
		}
		sp := PodOf(p)
		if sp.Finished || p.DeletionTimestamp != nil {
			continue
		}
		live[c.UID]++
		if sp.Node == "" && !sp.Unschedulable {
			untried[c.UID] = true
		}
	}
	out := map[types.UID]bool{}
	for uid, want := range wanted {
		if live[uid] >= want && !untried[uid] {
			out[uid] = true
		}
	}
	return out
}

// settleOwners marks the pending pods of in whose controller is settled
// (scale.Pod.OwnerSettled). It reads each such controller from the tenant once; one it
// cannot read is not settled (the batch keeps its idle second).
func (r *Reconciler) settleOwners(ctx context.Context, p *pass, w *tenantWatch, pods []*corev1.Pod, in []scale.Pod) {
	type ref struct {
		namespace string
		owner     metav1.OwnerReference
	}
	owners := map[types.UID]ref{}
	i := 0
	for _, pod := range pods {
		if pod == nil {
			continue
		}
		if sp := in[i]; sp.Unschedulable && !sp.Daemon && sp.Node == "" {
			if c := metav1.GetControllerOfNoCopy(pod); c != nil {
				owners[c.UID] = ref{pod.Namespace, *c}
			}
		}
		i++
	}
	if len(owners) == 0 {
		return
	}
	wanted := map[types.UID]int{}
	for uid, o := range owners {
		var obj metav1.Object
		var err error
		opts := metav1.GetOptions{}
		switch o.owner.Kind {
		case "ReplicaSet":
			obj, err = w.client.AppsV1().ReplicaSets(o.namespace).Get(ctx, o.owner.Name, opts)
		case "StatefulSet":
			obj, err = w.client.AppsV1().StatefulSets(o.namespace).Get(ctx, o.owner.Name, opts)
		case "Job":
			obj, err = w.client.BatchV1().Jobs(o.namespace).Get(ctx, o.owner.Name, opts)
		default:
			continue
		}
		if err != nil || obj.GetUID() != uid {
			if err != nil && !apierrors.IsNotFound(err) {
				r.Log.Error("nodehost_owner_unread", "cluster", p.key.String(), "owner", o.owner.Kind+" "+o.namespace+"/"+o.owner.Name, "error", err.Error())
			}
			continue
		}
		if n, ok := WantedPods(obj); ok {
			wanted[uid] = n
		}
	}
	settled := OwnersSettled(pods, wanted)
	i = 0
	for _, pod := range pods {
		if pod == nil {
			continue
		}
		if c := metav1.GetControllerOfNoCopy(pod); c != nil && settled[c.UID] {
			in[i].OwnerSettled = true
		}
		i++
	}
}
