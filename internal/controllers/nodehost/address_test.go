package nodehost

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestSharedAddresses(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	node := func(name, ip string, age time.Duration, closed bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(-age))}}
		if ip != "" {
			n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
		}
		if closed {
			n.Spec.Taints = []corev1.Taint{{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule}}
		}
		return n
	}
	claim := func(nodeName string, deleting bool) *v1alpha1.NodeClaim {
		c := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c-" + nodeName}, Spec: v1alpha1.NodeClaimSpec{NodeName: nodeName}}
		if deleting {
			now := metav1.NewTime(t0)
			c.DeletionTimestamp = &now
		}
		return c
	}
	claims := func(names ...string) []*v1alpha1.NodeClaim {
		var out []*v1alpha1.NodeClaim
		for _, n := range names {
			out = append(out, claim(n, false))
		}
		return out
	}
	for _, c := range []struct {
		name   string
		nodes  []*corev1.Node
		claims []*v1alpha1.NodeClaim
		want   map[string]string
	}{
		{"distinct addresses", []*corev1.Node{node("a", "10.78.0.2", time.Hour, false), node("b", "10.78.3.6", 0, true)}, claims("a", "b"),
			map[string]string{}},
		{"a new closed node with an open node's address is replaced",
			[]*corev1.Node{node("a", "10.78.0.2", time.Hour, false), node("b", "10.78.0.2", 0, true)}, claims("a", "b"),
			map[string]string{"b": "a"}},
		{"the open one is kept even when younger",
			[]*corev1.Node{node("a", "10.78.0.2", 0, false), node("b", "10.78.0.2", time.Hour, true)}, claims("a", "b"),
			map[string]string{"b": "a"}},
		{"two closed: the older is kept",
			[]*corev1.Node{node("a", "10.78.0.2", time.Minute, true), node("b", "10.78.0.2", time.Hour, true)}, claims("a", "b"),
			map[string]string{"a": "b"}},
		{"same age: by name",
			[]*corev1.Node{node("b", "10.78.0.2", 0, true), node("a", "10.78.0.2", 0, true)}, claims("a", "b"),
			map[string]string{"b": "a"}},
		{"two open nodes are left (pods may run on both)",
			[]*corev1.Node{node("a", "10.78.0.2", time.Hour, false), node("b", "10.78.0.2", 0, false)}, claims("a", "b"),
			map[string]string{}},
		{"a node joined by hand is never replaced, but is kept",
			[]*corev1.Node{node("hand", "10.78.0.2", 0, true), node("b", "10.78.0.2", 0, true)}, claims("b"),
			map[string]string{"b": "hand"}},
		{"a node whose claim is already going is not replaced again",
			[]*corev1.Node{node("a", "10.78.0.2", time.Hour, false), node("b", "10.78.0.2", 0, true)},
			[]*v1alpha1.NodeClaim{claim("a", false), claim("b", true)},
			map[string]string{}},
		{"three with one address: all but the kept one",
			[]*corev1.Node{node("a", "10.78.0.2", time.Hour, false), node("b", "10.78.0.2", 0, true), node("c", "10.78.0.2", time.Minute, true)},
			claims("a", "b", "c"), map[string]string{"b": "a", "c": "a"}},
		{"no InternalIP yet, or one that does not parse: nothing to compare",
			[]*corev1.Node{node("a", "", time.Hour, false), node("b", "", 0, true), node("c", "not-an-ip", 0, true), node("d", "not-an-ip", 0, true)},
			claims("a", "b", "c", "d"), map[string]string{}},
	} {
		if got := SharedAddresses(c.nodes, c.claims); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
