package cluster_test

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/cluster"
	"socialweb.computer/internal/testenv"
)

// A Cluster whose status was written by merge patch (the controller's server and instance,
// the node host's nodes and Scaling, under one manager) loses the server and instance once
// the controller stops setting them (no tenant control planes here), and keeps the node
// host's fields.
func TestStatusApplyClearsFieldsOfMergePatchedStatus(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	key := newCluster(t, env, "status-upgrade", v1alpha1.FinalizerClusterTeardown)
	var c v1alpha1.Cluster
	if err := env.Client.Get(ctx, key, &c); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
	c.Status.Phase, c.Status.Server, c.Status.Instance, c.Status.Nodes = v1alpha1.ClusterReady, "https://127.0.0.1:1", "i-1", 2
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionTrue, Reason: cluster.ReasonServing, Message: "serving"})
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionScaling), Status: metav1.ConditionFalse, Reason: "Steady", Message: "written by the node host"})
	if err := env.Client.Status().Patch(ctx, &c, patch); err != nil {
		t.Fatal(err)
	}

	settle(t, &cluster.Reconciler{Client: env.Client, Unavailable: "no tenant control planes in this test"}, key)

	var got v1alpha1.Cluster
	if err := env.Client.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1alpha1.ClusterUnavailable || got.Status.Server != "" || got.Status.Instance != "" {
		t.Fatalf("status %+v: want Unavailable with no server and no instance", got.Status)
	}
	sc := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionScaling))
	if got.Status.Nodes != 2 || sc == nil || sc.Message != "written by the node host" {
		t.Fatalf("status %+v: the node host's nodes and Scaling were lost", got.Status)
	}
	for _, e := range got.ManagedFields {
		if e.Manager == cluster.FieldManager && (e.Operation != metav1.ManagedFieldsOperationApply || e.Subresource != "status") {
			t.Fatalf("managed fields entry %+v: want the controller's applies of the status", e)
		}
	}
}
