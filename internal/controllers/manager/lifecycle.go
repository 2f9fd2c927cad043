package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// StopSlack is what a stop may take beyond the graceful shutdown of the runnables: giving
// the Lease up (one request, bounded by the lock client's timeout of RenewDeadline/2).
const StopSlack = RenewDeadline/2 + time.Second

// Manager is controller-runtime's manager with a bounded life. Its Start returns
//   - a *Forbidden as soon as the API server refuses a request of the caches, the leader
//     election or a reconcile, instead of retrying it forever;
//   - an error when the caches have not synced within the cache sync timeout;
//   - within the graceful shutdown (plus the Lease release) once its context ends, even when
//     a reconcile does not return or a cache never synced.
//
// The last point works around controller-runtime's Start, which does not return while a
// cache it waits for at start has not synced, stopped or not: the manager's runnable group
// loops on the done context until every cache reports ready. Nothing has reconciled nor
// taken the Lease before the caches sync, so such a Start is abandoned, and the process,
// which ends when Start returns, takes it along.
type Manager struct {
	manager.Manager
	log         *slog.Logger
	fatal       errorsOnce
	grace       time.Duration
	syncTimeout time.Duration
	// identity is the holder identity of the Lease; empty without leader election.
	identity string
	synced   atomic.Bool
	// lock is the Lease lock when its identity is the pod's (see releaseStaleLease).
	lock resourcelock.Interface
	// reader is the uncached reader, reporting a refused read as the client does.
	reader client.Reader
}

// GetAPIReader is the manager's uncached reader with refusals reported (see reportingFuncs).
func (m *Manager) GetAPIReader() client.Reader { return m.reader }

// Identity is the holder identity this manager writes in the leader Lease; empty without
// leader election.
func (m *Manager) Identity() string { return m.identity }

// Start runs the manager until ctx ends or it cannot go on; see Manager.
func (m *Manager) Start(ctx context.Context) error {
	if m.lock != nil && releaseStaleLease(ctx, m.lock, m.log) {
		select {
		case <-time.After(StaleLeaseYield):
		case <-ctx.Done():
			return nil
		}
	}
	inner, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Manager.Start(inner) }()
	go m.awaitSync(inner)
	if m.identity != "" {
		go func() {
			select {
			case <-m.Elected():
				m.log.Info("leading", "identity", m.identity)
			case <-inner.Done():
			}
		}()
	}
	var err error
	select {
	case err = <-done:
		return err
	case err = <-m.fatal.ch:
	case <-ctx.Done():
	}
	cancel()
	if !m.synced.Load() {
		return err
	}
	select {
	case e := <-done:
		if err == nil {
			err = e
		}
	case <-time.After(m.grace + StopSlack):
		if err == nil {
			err = fmt.Errorf("did not stop within %s", m.grace+StopSlack)
		}
	}
	return err
}

// awaitSync marks the manager ready once its caches have synced, and reports a sync that
// does not come within the timeout.
func (m *Manager) awaitSync(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, m.syncTimeout)
	defer cancel()
	if m.GetCache().WaitForCacheSync(sctx) {
		m.synced.Store(true)
		return
	}
	if ctx.Err() == nil {
		m.fatal.report(fmt.Errorf("caches did not sync within %s: is every socialweb.computer CRD installed and served?", m.syncTimeout))
	}
}

// cachesSynced is the readiness check: ready once the first sync is done.
func (m *Manager) cachesSynced(*http.Request) error {
	if !m.synced.Load() {
		return errors.New("caches have not synced")
	}
	return nil
}
