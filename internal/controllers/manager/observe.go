package manager

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ReconcileObserver is told when a reconcile of a controller starts. Benchmarks and
// harnesses use it to measure event-to-reconcile latency without touching the controller.
type ReconcileObserver func(controller string, req reconcile.Request, start time.Time)

// Observed wraps r so that obs hears of every reconcile before it runs.
func Observed(name string, r reconcile.Reconciler, obs ReconcileObserver) reconcile.Reconciler {
	if obs == nil {
		return r
	}
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		obs(name, req, time.Now())
		return r.Reconcile(ctx, req)
	})
}
