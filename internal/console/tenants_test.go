package console

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestTenantsToWatch(t *testing.T) {
	cl := func(name string, phase v1alpha1.ClusterPhase) v1alpha1.Cluster {
		return v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name}, Status: v1alpha1.ClusterStatus{Phase: phase}}
	}
	got := TenantsToWatch([]v1alpha1.Cluster{cl("ready", v1alpha1.ClusterReady), cl("init", v1alpha1.ClusterInitializing),
		cl("off", v1alpha1.ClusterUnavailable), cl("draining", v1alpha1.ClusterDraining), cl("new", "")})
	if diff := cmp.Diff(map[string]bool{"a/ready": true}, got); diff != "" {
		t.Errorf("watched (-want +got):\n%s", diff)
	}
}

func TestPendingPodsAndNodes(t *testing.T) {
	pod := func(ns, name, node string, phase corev1.PodPhase, conds ...corev1.PodCondition) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Phase: phase, Conditions: conds}}
	}
	gone := pod("default", "going", "", corev1.PodPending)
	gone.DeletionTimestamp = &metav1.Time{}
	pods := []corev1.Pod{
		pod("default", "web", "n1", corev1.PodRunning),
		pod("default", "starting", "n1", corev1.PodPending), // bound: a node took it
		pod("default", "done", "n1", corev1.PodSucceeded),
		pod("z", "big", "", corev1.PodPending, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: "Unschedulable", Message: "0/1 nodes are available: 1 Insufficient memory."}),
		pod("default", "new", "", corev1.PodPending),
		gone,
	}
	wantPending := []PendingPodRow{{Namespace: "default", Name: "new"},
		{Namespace: "z", Name: "big", Reason: "0/1 nodes are available: 1 Insufficient memory."}}
	if diff := cmp.Diff(wantPending, PendingPods(pods)); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
	nodes := []corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "n2"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}, {Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}},
	}
	wantNodes := []TenantNodeRow{{Name: "n1", Ready: "True", Pods: 2}, {Name: "n2", Ready: "Unknown"}}
	if diff := cmp.Diff(wantNodes, TenantNodes(TenantObjects{Nodes: nodes, Pods: pods})); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
}

func TestGuestsWithLogs(t *testing.T) {
	cc := func(name string, phase v1alpha1.ComputeContractPhase, accept string) v1alpha1.ComputeContract {
		return v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "d", Name: name}, Status: v1alpha1.ComputeContractStatus{Phase: phase, Accept: accept}}
	}
	got := GuestsWithLogs([]v1alpha1.ComputeContract{cc("held", "Held", "at://a"), cc("releasing", "Releasing", "at://b"),
		cc("requesting", "Requesting", ""), cc("released", "Released", "at://c"), cc("failed", "Failed", "at://d"), cc("held-no-accept", "Held", "")})
	if diff := cmp.Diff(map[string]string{"d/held": "at://a", "d/releasing": "at://b"}, got); diff != "" {
		t.Errorf("guests (-want +got):\n%s", diff)
	}
}
