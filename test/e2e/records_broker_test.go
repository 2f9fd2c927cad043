package e2e

import (
	"context"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/testenv"
	"socialweb.computer/internal/watch"
)

// A controller of another kind (here a probe standing in for Infra) is triggered by a
// record change through the broker's controller-runtime source, with no polling.
func TestACC_BrokerTriggersOtherControllers(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	localRepo(t, env, "me")
	newWatch(t, env, "notes", "me", noteCollection)

	m, err := ctrlmanager.New(env.Config, ctrlmanager.Options{SkipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	reqs := make(chan reconcile.Request, 10)
	toReq := func(_ context.Context, c watch.Change) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: key("probe-" + c.RKey)}}
	}
	err = ctrl.NewControllerManagedBy(m).Named("probe").
		WatchesRawSource(env.Broker.Source(handler.TypedEnqueueRequestsFromMapFunc(toReq))).
		Complete(reconcile.Func(func(_ context.Context, r reconcile.Request) (reconcile.Result, error) {
			reqs <- r
			return reconcile.Result{}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	defer func() { cancel(); <-done }()
	if !m.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("probe manager did not sync")
	}
	time.Sleep(100 * time.Millisecond) // the source subscribes when the controller starts

	user := userClient(t, env)
	if _, err := user.PutRecord(ctx, noteCollection, "deploy-1", note("go"), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reqs:
		if r.Name != "probe-deploy-1" {
			t.Fatalf("probe reconciled %s, want probe-deploy-1", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the record change did not reach the probe controller")
	}
}
