package manager

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// ReconcileObserver is told when a reconcile of a controller starts. Benchmarks and
// harnesses use it to measure event-to-reconcile latency without touching the controller.
type ReconcileObserver func(controller string, req reconcile.Request, start time.Time)

// Observed wraps r so that obs (when set) hears of every reconcile before it runs, and so
// that a reconcile cut short because the manager is stopping ends without an error: there
// is nothing left to retry, and a "Reconciler error ... context canceled" line per object
// in flight at shutdown would only bury the lines that matter.
func Observed(name string, r reconcile.Reconciler, obs ReconcileObserver) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		if obs != nil {
			obs(name, req, time.Now())
		}
		res, err := r.Reconcile(ctx, req)
		if err != nil && ctx.Err() != nil {
			return reconcile.Result{}, nil
		}
		return res, err
	})
}
