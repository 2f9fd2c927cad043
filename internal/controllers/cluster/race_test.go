package cluster_test

// The Cluster controller's finalizer writes race other writers of the same list: a writer
// that changes the finalizers between the controller's read and its patch must keep its
// change. A merge patch without the resourceVersion replaces the whole list from the stale
// read; a locked one conflicts, and the next pass reads again.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/cluster"
	"socialweb.computer/internal/testenv"
)

const (
	ns    = "default"
	other = "example.com/other-writer"
)

// racingClient is the real API server's client; the first Get of the Cluster is followed,
// before the controller sees its answer, by another writer's change made through the same
// server, so every write the controller then makes starts from a stale read.
type racingClient struct {
	client.Client
	once  sync.Once
	other func(ctx context.Context) error
	err   error
}

func (c *racingClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := c.Client.Get(ctx, key, obj, opts...)
	if _, ok := obj.(*v1alpha1.Cluster); ok && err == nil {
		c.once.Do(func() { c.err = c.other(ctx) })
	}
	return err
}

// otherFinalizer changes the Cluster's finalizers as another writer: add or remove other.
func otherFinalizer(c client.Client, key client.ObjectKey, add bool) func(context.Context) error {
	return func(ctx context.Context) error {
		var fresh v1alpha1.Cluster
		if err := c.Get(ctx, key, &fresh); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(fresh.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if add {
			controllerutil.AddFinalizer(&fresh, other)
		} else {
			controllerutil.RemoveFinalizer(&fresh, other)
		}
		return c.Patch(ctx, &fresh, patch)
	}
}

// settle runs the controller until it asks for nothing soon (a conflict asks again soon).
func settle(t *testing.T, r *cluster.Reconciler, key client.ObjectKey) {
	t.Helper()
	for i := 0; i < 5; i++ {
		res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: key})
		if err != nil {
			t.Fatalf("reconcile: %v", err)
		}
		if res.RequeueAfter == 0 || res.RequeueAfter > time.Second {
			return
		}
	}
	t.Fatalf("still requeueing soon after 5 passes")
}

func newCluster(t *testing.T, env *testenv.Env, name string, finalizers ...string) client.ObjectKey {
	t.Helper()
	c := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: finalizers},
		Spec: v1alpha1.ClusterSpec{Account: "did:plc:raceowner", Name: name}}
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	return client.ObjectKeyFromObject(c)
}

func TestFinalizerAddKeepsConcurrentFinalizer(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	key := newCluster(t, env, "race-add")
	rc := &racingClient{Client: env.Client, other: otherFinalizer(env.Client, key, true)}
	r := &cluster.Reconciler{Client: rc, Unavailable: "no tenant control planes in this test"}
	settle(t, r, key)
	if rc.err != nil {
		t.Fatalf("the other writer: %v", rc.err)
	}
	var got v1alpha1.Cluster
	if err := env.Client.Get(context.Background(), key, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Finalizers, other) || !slices.Contains(got.Finalizers, v1alpha1.FinalizerClusterTeardown) {
		t.Fatalf("finalizers %v: want both %s and the controller's %s", got.Finalizers, other, v1alpha1.FinalizerClusterTeardown)
	}
	if got.Status.Phase != v1alpha1.ClusterUnavailable {
		t.Fatalf("phase %q, want %s", got.Status.Phase, v1alpha1.ClusterUnavailable)
	}
}

func TestFinalizerRemoveKeepsConcurrentRemoval(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	key := newCluster(t, env, "race-remove", v1alpha1.FinalizerClusterTeardown, other)
	ctx := context.Background()
	if err := env.Client.Delete(ctx, &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}); err != nil {
		t.Fatal(err)
	}
	// The other writer lets go of the Cluster between the controller's read and its
	// teardown's finalizer patch: the stale list would write its finalizer back (the API
	// server refuses a new finalizer on an object being deleted, so that patch fails); a
	// locked patch conflicts, the next pass reads again, and the Cluster is gone.
	rc := &racingClient{Client: env.Client, other: otherFinalizer(env.Client, key, false)}
	r := &cluster.Reconciler{Client: rc, Unavailable: "no tenant control planes in this test"}
	settle(t, r, key)
	if rc.err != nil {
		t.Fatalf("the other writer: %v", rc.err)
	}
	var got v1alpha1.Cluster
	err := env.Client.Get(ctx, key, &got)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("Cluster still there (err %v) with finalizers %v: the other writer's removal was lost", err, got.Finalizers)
	}
}

// The node host writes the same status (its Scaling condition) between the controller's
// read and its status write: the controller applies only its own fields, so both conditions
// stay.
func TestStatusWriteKeepsConcurrentCondition(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	key := newCluster(t, env, "race-status", v1alpha1.FinalizerClusterTeardown)
	scaling := metav1.Condition{Type: string(v1alpha1.ConditionScaling), Status: metav1.ConditionFalse,
		Reason: "Steady", Message: "written by the node host"}
	nodeHost := func(ctx context.Context) error {
		var fresh v1alpha1.Cluster
		if err := env.Client.Get(ctx, key, &fresh); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(fresh.DeepCopy(), client.MergeFromWithOptimisticLock{})
		meta.SetStatusCondition(&fresh.Status.Conditions, scaling)
		fresh.Status.Nodes = 3
		return env.Client.Status().Patch(ctx, &fresh, patch)
	}
	rc := &racingClient{Client: env.Client, other: nodeHost}
	r := &cluster.Reconciler{Client: rc, Unavailable: "no tenant control planes in this test"}
	settle(t, r, key)
	if rc.err != nil {
		t.Fatalf("the node host: %v", rc.err)
	}
	var got v1alpha1.Cluster
	if err := env.Client.Get(context.Background(), key, &got); err != nil {
		t.Fatal(err)
	}
	ready := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady))
	sc := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionScaling))
	if ready == nil || ready.Reason != cluster.ReasonUnsupported || sc == nil || sc.Message != scaling.Message || got.Status.Nodes != 3 {
		t.Fatalf("status %+v: want the controller's Ready and the node host's Scaling and nodes", got.Status)
	}
}
