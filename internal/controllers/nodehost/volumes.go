package nodehost

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// A pod whose claim is bound to a local volume runs only on the volume's node: the
// PersistentVolume's node affinity (a local-path volume names its node's hostname). The
// scheduler's VolumeBinding filter holds the pod to it; the simulation does not run that
// filter (it would need listers of volumes, claims and classes), so the node host writes
// each such volume's node affinity into the pod's own required node affinity before
// simulating, as Karpenter's volume topology does. NodeAffinity then refuses every node the
// volume cannot be on: a new node always (so a pod whose volume's node is gone is reported,
// not rented for), and the others when its node is weighed for consolidation (so a node
// holding a volume's data is never drained away from it). A claim not bound yet
// (WaitForFirstConsumer) binds where its pod goes and adds nothing.

// maxAffinityTerms bounds the terms of a pod's node affinity with its volumes' added: each
// is a term of the pod's and of every volume's, so the count multiplies.
const maxAffinityTerms = 64

// VolumeAffinity is the node affinity p's volumes require: the AND of the node affinity of
// each PersistentVolume a claim of p is bound to (nil: none), and the name of the first such
// volume, for reasons. claim and volume read the tenant's objects (nil: not there); a
// claim or volume not there adds nothing (the scheduler waits for it, and so does a node).
func VolumeAffinity(p *corev1.Pod, claim func(namespace, name string) *corev1.PersistentVolumeClaim,
	volume func(name string) *corev1.PersistentVolume) (*corev1.NodeSelector, string) {
	var sel *corev1.NodeSelector
	first := ""
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		c := claim(p.Namespace, v.PersistentVolumeClaim.ClaimName)
		if c == nil || c.Spec.VolumeName == "" {
			continue
		}
		pv := volume(c.Spec.VolumeName)
		if pv == nil || pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
			continue
		}
		sel = andSelectors(sel, pv.Spec.NodeAffinity.Required)
		if first == "" {
			first = pv.Name
		}
	}
	return sel, first
}

// WithVolumeAffinity is a copy of p whose required node affinity is its own and sel's
// (p itself when sel is nil).
func WithVolumeAffinity(p *corev1.Pod, sel *corev1.NodeSelector) *corev1.Pod {
	if sel == nil {
		return p
	}
	p = p.DeepCopy()
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	if p.Spec.Affinity.NodeAffinity == nil {
		p.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := p.Spec.Affinity.NodeAffinity
	na.RequiredDuringSchedulingIgnoredDuringExecution = andSelectors(na.RequiredDuringSchedulingIgnoredDuringExecution, sel)
	return p
}

// andSelectors is a node selector that matches a node when both a and b do: a selector
// matches when any of its terms does, so the result has a term for each pair of a term of a
// and a term of b, with both terms' requirements. Past maxAffinityTerms it is b's terms
// alone: the volume's requirement holds, the pod's own is left to the scheduler (the
// simulation may then place the pod where the scheduler would not). nil is no constraint.
func andSelectors(a, b *corev1.NodeSelector) *corev1.NodeSelector {
	switch {
	case a == nil || len(a.NodeSelectorTerms) == 0:
		return b.DeepCopy()
	case b == nil || len(b.NodeSelectorTerms) == 0:
		return a.DeepCopy()
	case len(a.NodeSelectorTerms)*len(b.NodeSelectorTerms) > maxAffinityTerms:
		return b.DeepCopy()
	}
	out := &corev1.NodeSelector{}
	for _, ta := range a.NodeSelectorTerms {
		for _, tb := range b.NodeSelectorTerms {
			var t corev1.NodeSelectorTerm
			t.MatchExpressions = append(append(t.MatchExpressions, ta.DeepCopy().MatchExpressions...), tb.DeepCopy().MatchExpressions...)
			t.MatchFields = append(append(t.MatchFields, ta.DeepCopy().MatchFields...), tb.DeepCopy().MatchFields...)
			out.NodeSelectorTerms = append(out.NodeSelectorTerms, t)
		}
	}
	return out
}

// volumeReason is the reason a pod held by its volume fits no node: the volume, and the
// scheduler's own reason.
func volumeReason(volume, why string) string {
	return fmt.Sprintf("its volume %s is on a node that is gone or cannot take it (%s)", volume, why)
}

// withVolumes is pods with each one held by a local volume given its volume's node affinity
// (WithVolumeAffinity), and, by namespace/name, the volume that holds each.
func (w *tenantWatch) withVolumes(pods []*corev1.Pod) ([]*corev1.Pod, map[string]string) {
	claim := func(namespace, name string) *corev1.PersistentVolumeClaim {
		c, err := w.claims.PersistentVolumeClaims(namespace).Get(name)
		if err != nil {
			return nil
		}
		return c
	}
	volume := func(name string) *corev1.PersistentVolume {
		v, err := w.volumes.Get(name)
		if err != nil {
			return nil
		}
		return v
	}
	out := make([]*corev1.Pod, len(pods))
	held := map[string]string{}
	for i, p := range pods {
		out[i] = p
		if p == nil || PodOf(p).Finished {
			continue
		}
		if sel, pv := VolumeAffinity(p, claim, volume); sel != nil {
			out[i] = WithVolumeAffinity(p, sel)
			held[p.Namespace+"/"+p.Name] = pv
		}
	}
	return out, held
}
