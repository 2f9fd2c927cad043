package reconcilekit_test

// ApplyStatus against the real API server: the writers of one status apply their own
// fields side by side, and an object whose status was written by the old merge patches
// loses a field its writer stops setting.

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/testenv"
)

// The two writers of a Cluster's status, as the Cluster controller and the node host own it.
var (
	controllerOwner = reconcilekit.StatusOwner{Manager: "test/cluster",
		Fields:     []string{"observedGeneration", "phase", "server", "instance", "teardownBlocked"},
		Conditions: []string{string(v1alpha1.ConditionReady)}}
	nodeHostOwner = reconcilekit.StatusOwner{Manager: "test/nodehost",
		Fields: []string{"nodes"}, Conditions: []string{string(v1alpha1.ConditionScaling)}}
)

func newCluster(t *testing.T, c client.Client, name string) client.ObjectKey {
	t.Helper()
	obj := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.ClusterSpec{Account: "did:plc:applyowner", Name: name}}
	if err := c.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(obj)
}

// applyAs reads the Cluster, lets change set the writer's fields on a copy and applies them.
func applyAs(ctx context.Context, c client.Client, o reconcilekit.StatusOwner, key client.ObjectKey, change func(*v1alpha1.Cluster)) error {
	var stored v1alpha1.Cluster
	if err := c.Get(ctx, key, &stored); err != nil {
		return err
	}
	obj := stored.DeepCopy()
	change(obj)
	_, err := reconcilekit.ApplyStatus(ctx, c, o, &stored, obj)
	return err
}

func condition(t string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	return metav1.Condition{Type: t, Status: status, Reason: reason, Message: msg}
}

func get(t *testing.T, c client.Client, key client.ObjectKey) *v1alpha1.Cluster {
	t.Helper()
	var got v1alpha1.Cluster
	if err := c.Get(context.Background(), key, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// Both writers apply their own fields at once, each from reads that the other's writes make
// stale: every last value of each stays.
func TestApplyStatusConcurrentWritersLoseNothing(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	key := newCluster(t, env.Client, "apply-concurrent")
	const rounds = 25
	var wg sync.WaitGroup
	errs := make(chan error, 2*rounds)
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 1; i <= rounds; i++ {
			errs <- applyAs(ctx, env.Client, controllerOwner, key, func(c *v1alpha1.Cluster) {
				c.Status.Phase, c.Status.Server = v1alpha1.ClusterReady, fmt.Sprintf("https://cp.example/%d", i)
				meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionReady), metav1.ConditionTrue, "Serving", fmt.Sprintf("round %d", i)))
			})
		}
	}()
	go func() {
		defer wg.Done()
		for i := 1; i <= rounds; i++ {
			errs <- applyAs(ctx, env.Client, nodeHostOwner, key, func(c *v1alpha1.Cluster) {
				c.Status.Nodes = int32(i)
				meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionScaling), metav1.ConditionTrue, "ScalingUp", fmt.Sprintf("round %d", i)))
			})
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("apply: %v", err)
		}
	}
	got := get(t, env.Client, key)
	ready := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
	scaling := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionScaling))
	last := fmt.Sprintf("round %d", rounds)
	if got.Status.Server != fmt.Sprintf("https://cp.example/%d", rounds) || got.Status.Nodes != rounds ||
		ready == nil || ready.Message != last || scaling == nil || scaling.Message != last {
		t.Fatalf("status %+v: want both writers' last values", got.Status)
	}
}

// mergePatchStatus writes a status the way the writers did before apply: a locked merge
// patch through a client with no field manager.
func mergePatchStatus(t *testing.T, c client.Client, key client.ObjectKey, change func(*v1alpha1.Cluster)) {
	t.Helper()
	obj := get(t, c, key)
	patch := client.MergeFromWithOptions(obj.DeepCopy(), client.MergeFromWithOptimisticLock{})
	change(obj)
	if err := c.Status().Patch(context.Background(), obj, patch); err != nil {
		t.Fatal(err)
	}
}

// A status both writers wrote by merge patch, under one manager: a field each writer then
// stops setting is removed by its apply, and the other writer's fields stay.
func TestApplyStatusRemovesFieldsOfMergePatchedStatus(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	key := newCluster(t, env.Client, "apply-upgrade")
	mergePatchStatus(t, env.Client, key, func(c *v1alpha1.Cluster) {
		c.Status.Phase, c.Status.TeardownBlocked = v1alpha1.ClusterDraining, "stopping the control plane"
		meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionReady), metav1.ConditionFalse, "Draining", "deleting"))
	})
	mergePatchStatus(t, env.Client, key, func(c *v1alpha1.Cluster) {
		c.Status.Nodes = 3
		meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionScaling), metav1.ConditionFalse, "Steady", "steady"))
	})
	for _, e := range get(t, env.Client, key).ManagedFields {
		t.Logf("before apply: manager %q operation %s subresource %q fields %s", e.Manager, e.Operation, e.Subresource, e.FieldsV1.GetRawString())
	}

	if err := applyAs(ctx, env.Client, controllerOwner, key, func(c *v1alpha1.Cluster) {
		c.Status.TeardownBlocked = ""
		meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionReady), metav1.ConditionFalse, "Draining", "store removed"))
	}); err != nil {
		t.Fatal(err)
	}
	got := get(t, env.Client, key)
	for _, e := range got.ManagedFields {
		t.Logf("after apply: manager %q operation %s subresource %q fields %s", e.Manager, e.Operation, e.Subresource, e.FieldsV1.GetRawString())
	}
	if got.Status.TeardownBlocked != "" {
		t.Fatalf("teardownBlocked %q: the controller no longer sets it, it should be gone", got.Status.TeardownBlocked)
	}
	if got.Status.Nodes != 3 || meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionScaling)) == nil {
		t.Fatalf("status %+v: the node host's nodes and Scaling were lost", got.Status)
	}

	if err := applyAs(ctx, env.Client, nodeHostOwner, key, func(c *v1alpha1.Cluster) {
		c.Status.Nodes = 0
		meta.SetStatusCondition(&c.Status.Conditions, condition(string(v1alpha1.ConditionScaling), metav1.ConditionFalse, "Stopped", "stopped"))
	}); err != nil {
		t.Fatal(err)
	}
	got = get(t, env.Client, key)
	if got.Status.Nodes != 0 {
		t.Fatalf("nodes %d: the node host no longer sets it, it should be gone", got.Status.Nodes)
	}
	ready := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
	if ready == nil || ready.Message != "store removed" || got.Status.Phase != v1alpha1.ClusterDraining {
		t.Fatalf("status %+v: the controller's phase and Ready were lost", got.Status)
	}
}
