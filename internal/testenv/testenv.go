// Package testenv starts the embedded core in-process, on a free loopback port and a
// temporary data dir, for end-to-end tests and benchmarks: the real etcd and API server,
// the real CRDs, and optionally the real controllers.
package testenv

import (
	"context"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"socialweb.computer/config/crd"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/logsink"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/watch"
)

// Env is a running core, and its controllers when asked for.
type Env struct {
	Core   *core.Core
	Config *rest.Config
	// Client talks to the API server directly (no cache), as admin.
	Client client.Client
	// Reconciles receives every reconcile start when controllers run.
	Reconciles chan Reconcile
	// PDS is the embedded PDS the controllers use for local repos (Options.PDS or
	// Options.PDSServer), and Account its default account when the harness created it.
	PDS     *pds.Server
	Account *app.LocalAccount
	// Broker carries the record changes of AtprotoRecordWatches; Resolver holds the repo
	// sessions of the controllers.
	Broker   *watch.Broker
	Resolver *repos.Resolver
	// MarketSources are the firehoses the requester follows besides its repos' PDSes
	// (app.ControllerOptions.MarketSources), read when controllers start.
	MarketSources []string

	stopControllers context.CancelFunc
	controllersDone chan error
	mu              sync.Mutex
}

// Reconcile is one reconcile start seen by the observer.
type Reconcile struct {
	Controller string
	Request    reconcile.Request
	At         time.Time
}

// Options for Start.
type Options struct {
	// Controllers runs every controller in the same process.
	Controllers bool
	// DataDir reuses a data dir (to test restarts); empty means a new temporary one.
	DataDir string
	// PDS starts an embedded PDS with the project's lexicons and a default account
	// (app.DefaultHandle) on a temporary dir, stopped at cleanup.
	PDS bool
	// PDSServer is a PDS the caller runs (and stops) to hand to the controllers instead.
	PDSServer *pds.Server
	// MarketSources is Env.MarketSources.
	MarketSources []string
	// Log receives the warnings and errors of the core and the controllers; nil is stderr.
	Log io.Writer
}

// TB is the part of testing.TB the harness needs, so benchmarks outside `go test` can use it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Start starts a core (and controllers) and stops everything at cleanup.
func Start(t TB, o Options) *Env {
	t.Helper()
	dirPath := o.DataDir
	if dirPath == "" {
		dirPath = t.TempDir()
	}
	dir, err := core.OpenDataDir(dirPath)
	if err != nil {
		t.Fatalf("data dir: %v", err)
	}
	if os.Getenv("SOCIALWEB_TEST_KLOG") == "" {
		logsink.KlogTo(io.Discard)
	}
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatalf("CRDs: %v", err)
	}
	sink := o.Log
	if sink == nil {
		sink = os.Stderr
	}
	log := slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := core.Start(ctx, core.Config{Dir: dir, CRDs: crds, Logger: log})
	if err != nil {
		t.Fatalf("core: %v", err)
	}
	e := &Env{Core: c, Config: c.RESTConfig, Reconciles: make(chan Reconcile, 100000), Broker: &watch.Broker{}, Resolver: &repos.Resolver{}, MarketSources: o.MarketSources}
	// The PDS is closed after the controllers stop (cleanups run last-registered first).
	switch {
	case o.PDSServer != nil:
		e.PDS = o.PDSServer
	case o.PDS:
		e.PDS, e.Account = StartPDS(t, t.TempDir(), "")
	}
	t.Cleanup(e.Stop)
	// controller-runtime's client logs through its global logger; unset, it prints a
	// stack trace 30 s into the run to say so.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	e.Client, err = client.New(c.RESTConfig, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	if o.Controllers {
		e.StartControllers(t, log)
	}
	return e
}

// StartControllers runs every controller against the core until Stop.
func (e *Env) StartControllers(t TB, log *slog.Logger) {
	t.Helper()
	obs := func(name string, req reconcile.Request, at time.Time) {
		select {
		case e.Reconciles <- Reconcile{Controller: name, Request: req, At: at}:
		default:
		}
	}
	m, err := app.NewControllers(e.Config, app.ControllerOptions{Observer: obs, SkipNameValidation: true, Logger: log, PDS: e.PDS, Broker: e.Broker, Resolver: e.Resolver, MarketSources: e.MarketSources})
	if err != nil {
		t.Fatalf("controllers: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.stopControllers, e.controllersDone = cancel, make(chan error, 1)
	go func() { e.controllersDone <- m.Start(ctx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !m.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatalf("controller caches did not sync")
	}
}

// Stop stops the controllers, then the core. Safe to call twice.
func (e *Env) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopControllers != nil {
		e.stopControllers()
		<-e.controllersDone
		e.stopControllers = nil
	}
	e.Core.Stop()
}

// StartPDS starts an embedded PDS with the project's lexicons and its default account in
// dir (reusing both when dir holds them), listening on addr ("" for a free loopback port),
// and closes it at cleanup (closing it earlier is fine).
func StartPDS(t TB, dir, addr string) (*pds.Server, *app.LocalAccount) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := app.StartPDS(ctx, app.PDSOptions{DataDir: dir, Addr: addr, Logger: log})
	if err != nil {
		t.Fatalf("PDS: %v", err)
	}
	t.Cleanup(func() { srv.Close() })
	acct, err := app.EnsureLocalAccount(ctx, srv, dir, app.DefaultHandle)
	if err != nil {
		t.Fatalf("PDS account: %v", err)
	}
	return srv, acct
}

// Eventually polls cond until it returns true or timeout passes. A cheap cond (a read of
// the API) is polled every 10 ms, so a figure taken with it is fine-grained; an expensive
// one (a kubectl process, an exec into a pod) waits twice its own duration between calls
// (at most a second), so a row waiting on it leaves two thirds of the machine to the rows
// running beside it rather than spinning kubectl.
func Eventually(t TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		start := time.Now()
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(pollWait(time.Since(start)))
	}
	t.Fatalf("%s: not true after %s (last error: %v)", what, timeout, last)
}

// pollWait is Eventually's wait after a call of cond that took spent.
func pollWait(spent time.Duration) time.Duration {
	return min(max(10*time.Millisecond, 2*spent), time.Second)
}
