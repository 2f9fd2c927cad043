package reconcilekit

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

var (
	clusterOwner = StatusOwner{Manager: "test/cluster",
		Fields:     []string{"observedGeneration", "phase", "server", "teardownBlocked"},
		Conditions: []string{string(v1alpha1.ConditionReady)}}
	nodeHostOwner = StatusOwner{Manager: "test/nodehost",
		Fields: []string{"nodes"}, Conditions: []string{string(v1alpha1.ConditionScaling)}}
)

func TestStatusOwnerChanged(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	base := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", ResourceVersion: "1"},
		Status: v1alpha1.ClusterStatus{Phase: v1alpha1.ClusterReady, Server: "https://cp", Nodes: 2, Conditions: []metav1.Condition{
			{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionTrue, Reason: "Serving", LastTransitionTime: at},
			{Type: string(v1alpha1.ConditionScaling), Status: metav1.ConditionFalse, Reason: "Steady", LastTransitionTime: at},
		}}}
	for _, tc := range []struct {
		name   string
		owner  StatusOwner
		change func(*v1alpha1.Cluster)
		want   bool
	}{
		{"same", clusterOwner, func(*v1alpha1.Cluster) {}, false},
		{"metadata and spec only", clusterOwner, func(c *v1alpha1.Cluster) { c.ResourceVersion = "2"; c.Spec.Running = true }, false},
		{"another writer's field", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Nodes = 5 }, false},
		{"another writer's condition", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Conditions[1].Message = "x" }, false},
		{"another writer's condition dropped", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Conditions = c.Status.Conditions[:1] }, false},
		{"an owned field", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Phase = v1alpha1.ClusterDraining }, true},
		{"an owned field set", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.TeardownBlocked = "x" }, true},
		{"an owned field cleared", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Server = "" }, true},
		{"an owned condition", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Conditions[0].Message = "x" }, true},
		{"an owned condition dropped", clusterOwner, func(c *v1alpha1.Cluster) { c.Status.Conditions = c.Status.Conditions[1:] }, true},
		{"under a second is what the API server keeps", clusterOwner, func(c *v1alpha1.Cluster) {
			c.Status.Conditions[0].LastTransitionTime = metav1.NewTime(at.Add(300 * time.Millisecond))
		}, false},
		{"the other writer's view: nodes", nodeHostOwner, func(c *v1alpha1.Cluster) { c.Status.Nodes = 0 }, true},
		{"the other writer's view: phase", nodeHostOwner, func(c *v1alpha1.Cluster) { c.Status.Phase = "" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := base.DeepCopy()
			tc.change(obj)
			_, got, err := tc.owner.changed(base, obj)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("changed = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStatusOwnerProjectSendsOnlyOwnedFields(t *testing.T) {
	c := &v1alpha1.Cluster{Status: v1alpha1.ClusterStatus{Phase: v1alpha1.ClusterReady, Nodes: 2, Conditions: []metav1.Condition{
		{Type: string(v1alpha1.ConditionScaling), Status: metav1.ConditionFalse, Reason: "Steady"},
	}}}
	got, err := clusterOwner.project(c)
	if err != nil {
		t.Fatal(err)
	}
	// No zero observedGeneration, server or teardownBlocked, no nodes, no Scaling.
	if diff := cmp.Diff(map[string]any{"phase": "Ready"}, got); diff != "" {
		t.Fatalf("project (-want +got):\n%s", diff)
	}
	if _, err := clusterOwner.project(&metav1.PartialObjectMetadata{}); err == nil {
		t.Fatal("project of an object without a status: want an error")
	}
}

func TestUpgradedStatusManagers(t *testing.T) {
	fields := metav1.NewFieldsV1
	legacy := metav1.ManagedFieldsEntry{Manager: "socialweb", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "socialweb.computer/v1alpha1",
		Subresource: "status", FieldsType: "FieldsV1",
		FieldsV1: fields(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:type":{}},"k:{\"type\":\"Scaling\"}":{".":{},"f:type":{}}},"f:nodes":{},"f:phase":{}}}`)}
	spec := metav1.ManagedFieldsEntry{Manager: "socialweb", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "socialweb.computer/v1alpha1",
		FieldsType: "FieldsV1", FieldsV1: fields(`{"f:spec":{"f:name":{}}}`)}

	got, changed, err := upgradedStatusManagers([]metav1.ManagedFieldsEntry{spec, legacy}, clusterOwner)
	if err != nil || !changed {
		t.Fatalf("upgrade: changed %v, err %v", changed, err)
	}
	want := []metav1.ManagedFieldsEntry{spec, legacy, legacy}
	want[1].Manager, want[1].Operation = clusterOwner.Manager, metav1.ManagedFieldsOperationApply
	want[1].FieldsV1 = fields(`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:type":{}}},"f:phase":{}}}`)
	want[2].FieldsV1 = fields(`{"f:status":{"f:conditions":{"k:{\"type\":\"Scaling\"}":{".":{},"f:type":{}}},"f:nodes":{}}}`)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("entries (-want +got):\n%s", diff)
	}

	// The node host's upgrade then takes the rest; the controller's is done.
	got, changed, err = upgradedStatusManagers(got, nodeHostOwner)
	if err != nil || !changed || len(got) != 3 || got[2].Manager != nodeHostOwner.Manager || got[2].Operation != metav1.ManagedFieldsOperationApply {
		t.Fatalf("node host's upgrade: %+v, changed %v, err %v", got, changed, err)
	}
	if _, changed, err := upgradedStatusManagers(got, clusterOwner); err != nil || changed {
		t.Fatalf("second upgrade: changed %v, err %v; want nothing to do", changed, err)
	}
}
