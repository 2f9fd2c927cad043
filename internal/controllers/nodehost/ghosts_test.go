package nodehost

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestUpkeepOf(t *testing.T) {
	node := func(name, claim string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if claim != "" {
			n.Labels = map[string]string{ClaimLabel: claim}
		}
		return n
	}
	claim := func(name, nodeName string, deleting bool) *v1alpha1.NodeClaim {
		c := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.NodeClaimSpec{NodeName: nodeName}}
		if deleting {
			now := metav1.Now()
			c.DeletionTimestamp = &now
		}
		return c
	}
	for _, c := range []struct {
		name   string
		nodes  []*corev1.Node
		claims []*v1alpha1.NodeClaim
		want   nodeUpkeep
	}{
		{"a claimed node gets the label", []*corev1.Node{node("node-1", "")}, []*v1alpha1.NodeClaim{claim("c-node-1", "node-1", false)},
			nodeUpkeep{Label: map[string]string{"node-1": "c-node-1"}}},
		{"a labelled claimed node is left", []*corev1.Node{node("node-1", "c-node-1")}, []*v1alpha1.NodeClaim{claim("c-node-1", "node-1", false)},
			nodeUpkeep{Label: map[string]string{}}},
		{"a labelled node no claim names is a ghost", []*corev1.Node{node("node-2", "c-node-2"), node("node-1", "c-node-1")}, nil,
			nodeUpkeep{Label: map[string]string{}, Ghosts: []string{"node-1", "node-2"}}},
		{"a deleting claim still names its node", []*corev1.Node{node("node-1", "c-node-1")}, []*v1alpha1.NodeClaim{claim("c-node-1", "node-1", true)},
			nodeUpkeep{Label: map[string]string{}}},
		{"a node joined by hand is never touched", []*corev1.Node{node("by-hand", "")}, nil,
			nodeUpkeep{Label: map[string]string{}}},
		{"a node whose label names another claim is relabelled", []*corev1.Node{node("node-1", "old")}, []*v1alpha1.NodeClaim{claim("new", "node-1", false)},
			nodeUpkeep{Label: map[string]string{"node-1": "new"}}},
	} {
		if got := upkeepOf(c.nodes, c.claims); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
