package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"socialweb.computer/config/crd"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/logsink"
)

// inProcess is the core, and the controllers when asked for, running in this process on a
// temporary data dir: built by the constructors `up` builds them with (core.Start,
// app.NewControllers), so that the figures are those of the stack `up` runs.
type inProcess struct {
	// tmp holds the data dir; stop removes it.
	tmp  string
	core *core.Core
	// client talks to the API server directly (no cache), as admin.
	client client.Client

	stopControllers context.CancelFunc
	controllersDone chan error
}

// reconcileStart is one reconcile start the controllers' observer saw.
type reconcileStart struct {
	Controller string
	Request    reconcile.Request
	At         time.Time
}

// startInProcess starts a core whose warnings and errors go to logTo; with reconciles non-nil
// it also runs every controller, sending each reconcile start to reconciles (dropped when the
// channel is full). The caller stops it.
func startInProcess(ctx context.Context, logTo io.Writer, reconciles chan<- reconcileStart) (_ *inProcess, err error) {
	tmp, err := os.MkdirTemp("", "socialweb-bench-")
	if err != nil {
		return nil, err
	}
	p := &inProcess{tmp: tmp}
	defer func() {
		if err != nil {
			p.stop()
		}
	}()
	dir, err := core.OpenDataDir(filepath.Join(tmp, "data"))
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// The API server logs at info level through klog; the figures need none of it.
	logsink.KlogTo(io.Discard)
	crds, err := crd.CRDs()
	if err != nil {
		dir.Close()
		return nil, fmt.Errorf("CRDs: %w", err)
	}
	log := slog.New(slog.NewTextHandler(logTo, &slog.HandlerOptions{Level: slog.LevelWarn}))
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if p.core, err = core.Start(startCtx, core.Config{Dir: dir, CRDs: crds, Logger: log}); err != nil {
		return nil, fmt.Errorf("core: %w", err)
	}
	// controller-runtime's client logs through its global logger; unset, it prints a stack
	// trace 30 s into the run to say so.
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	if p.client, err = client.New(p.core.RESTConfig, client.Options{Scheme: manager.Scheme()}); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if reconciles == nil {
		return p, nil
	}
	observe := func(name string, req reconcile.Request, at time.Time) {
		select {
		case reconciles <- reconcileStart{Controller: name, Request: req, At: at}:
		default:
		}
	}
	m, err := app.NewControllers(p.core.RESTConfig, app.ControllerOptions{Observer: observe, SkipNameValidation: true, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("controllers: %w", err)
	}
	// Not a child of ctx: stop stops the controllers first, then the core.
	ctrlCtx, stopControllers := context.WithCancel(context.WithoutCancel(ctx))
	p.stopControllers, p.controllersDone = stopControllers, make(chan error, 1)
	go func() { p.controllersDone <- m.Start(ctrlCtx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !m.GetCache().WaitForCacheSync(syncCtx) {
		return nil, errors.New("controller caches did not sync")
	}
	return p, nil
}

// stop stops the controllers, then the core, and removes the data dir.
func (p *inProcess) stop() {
	if p.stopControllers != nil {
		p.stopControllers()
		<-p.controllersDone
	}
	if p.core != nil {
		p.core.Stop()
	}
	os.RemoveAll(p.tmp)
}
