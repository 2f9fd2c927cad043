// Package manager builds the controller manager that runs every socialweb controller, in
// `socialweb up` against the embedded core and in `socialweb controllers` against any
// Kubernetes-compatible API server.
//
// The decision that shapes it: a reconcile must follow a watch event within milliseconds.
// controller-runtime's defaults are tuned for large clusters (client-side throttling at
// 20 QPS, a 5 ms to 1000 s per-item backoff plus a 10 QPS bucket); each controller here
// is registered with its own name, bounded concurrency and a rate limiter whose first
// retry is fast, and the client the manager hands out is not throttled.
//
// The second: the manager's life is bounded (Manager). A permission the API server refuses
// ends it with one *Forbidden naming what to grant, rather than an informer or a reconcile
// retrying it forever; a stop ends it within its grace period even when a cache never
// synced; and a leader gives its Lease up when it stops, so a replica takes over in about a
// second.
package manager

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// Options configure the manager.
type Options struct {
	// MetricsAddr serves Prometheus metrics; "" or "0" turns the endpoint off.
	MetricsAddr string
	// MetricsSecure serves metrics over HTTPS, to callers the API server authenticates and
	// authorizes (a TokenReview and a SubjectAccessReview for GET on the metrics path), as
	// a kube-prometheus scrape expects. MetricsCertDir holds tls.crt and tls.key; without
	// them the server makes a self-signed pair at start.
	MetricsSecure  bool
	MetricsCertDir string
	// HealthAddr serves /healthz (the process answers) and /readyz (its caches have
	// synced); "" or "0" turns them off.
	HealthAddr string
	// LeaderElection turns on leader election, for running several replicas against one
	// API server. The embedded default is one process and needs none.
	LeaderElection          bool
	LeaderElectionNamespace string
	Logger                  *slog.Logger
	// SkipNameValidation allows several managers in one process (tests, benchmarks).
	SkipNameValidation bool
	// GracefulShutdown bounds how long reconciles in flight get to end once the manager
	// is asked to stop; 0 means controller-runtime's 30 s (what `up` keeps; `socialweb
	// controllers` passes DefaultGracefulShutdown).
	GracefulShutdown time.Duration
	// CacheSyncTimeout bounds the first sync of the caches; 0 means DefaultCacheSyncTimeout.
	CacheSyncTimeout time.Duration
}

// DefaultGracefulShutdown is the time reconciles in flight get to end after a SIGTERM to
// `socialweb controllers`: with the Lease release after it, well within the 30 s a kubelet
// waits between SIGTERM and SIGKILL.
const DefaultGracefulShutdown = 10 * time.Second

// DefaultCacheSyncTimeout bounds the first sync of every watched kind (controller-runtime's
// default for its controllers, now for the manager's caches too). A refused list is
// reported at once; this catches the rest (a list that never answers, a kind not served).
const DefaultCacheSyncTimeout = 2 * time.Minute

// Scheme holds every kind the controllers read or write.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// New returns a manager for cfg. Controllers are added with Register.
func New(cfg *rest.Config, o Options) (*Manager, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 {
		// An unset QPS means client-go's default of 5, which alone costs tens of ms per write
		// under load; the API servers we run against are ours or sized for controllers.
		cfg.QPS, cfg.Burst = 200, 400
	}
	m := &Manager{log: log, fatal: newErrorsOnce(), grace: o.GracefulShutdown, syncTimeout: o.CacheSyncTimeout}
	if m.grace <= 0 {
		m.grace = 30 * time.Second
	}
	if m.syncTimeout <= 0 {
		m.syncTimeout = DefaultCacheSyncTimeout
	}
	metrics := metricsserver.Options{BindAddress: orOff(o.MetricsAddr)}
	if o.MetricsSecure {
		metrics.SecureServing = true
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		metrics.CertDir = o.MetricsCertDir
	}
	opts := ctrl.Options{
		Scheme:                 Scheme(),
		Metrics:                metrics,
		HealthProbeBindAddress: orOff(o.HealthAddr),
		Cache:                  cache.Options{DefaultWatchErrorHandler: watchErrorHandler(m.fatal.report)},
		NewClient:              reportingClient(m.fatal.report),
		Controller: config.Controller{SkipNameValidation: ptr(o.SkipNameValidation),
			CacheSyncTimeout: m.syncTimeout},
		GracefulShutdownTimeout: ptr(m.grace),
		Logger:                  logr.FromSlogHandler(log.Handler()),
	}
	if o.LeaderElection {
		ns := LeaderElectionNamespace(o.LeaderElectionNamespace)
		lock, perPod, err := newLeaseLock(cfg, ns, m.fatal.report)
		if err != nil {
			return nil, err
		}
		opts.LeaderElection = true
		opts.LeaderElectionID = LeaderElectionID
		opts.LeaderElectionNamespace = ns
		opts.LeaderElectionResourceLockInterface = lock
		// Safe because the process ends when the manager does: nothing reconciles after the
		// Lease is given up.
		opts.LeaderElectionReleaseOnCancel = true
		opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = ptr(LeaseDuration), ptr(RenewDeadline), ptr(RetryPeriod)
		m.identity = lock.Identity()
		if perPod {
			m.lock = lock
		}
	}
	inner, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, err
	}
	m.Manager = inner
	reader, err := reportingClient(m.fatal.report)(cfg, client.Options{HTTPClient: inner.GetHTTPClient(),
		Scheme: inner.GetScheme(), Mapper: inner.GetRESTMapper()})
	if err != nil {
		return nil, err
	}
	m.reader = reader
	if err := m.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := m.AddReadyzCheck("caches", m.cachesSynced); err != nil {
		return nil, err
	}
	return m, nil
}

func orOff(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

// ControllerOptions are the bounded defaults every controller is registered with.
func ControllerOptions(concurrency int) controller.Options {
	return controller.Options{
		MaxConcurrentReconciles: concurrency,
		RateLimiter:             RateLimiter(),
		// Reconciles of objects that already exist at start are as urgent as new ones.
		NeedLeaderElection: ptr(true),
	}
}

// RateLimiter backs off per object from 10 ms to 2 minutes, and caps the whole queue at
// 200 retries a second with bursts of 500: fast first retries for the optimistic-lock
// conflicts that two writers produce, bounded storms for an object that keeps failing.
func RateLimiter() workqueue.TypedRateLimiter[reconcile.Request] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](10*time.Millisecond, 2*time.Minute),
		&workqueue.TypedBucketRateLimiter[reconcile.Request]{Limiter: rate.NewLimiter(rate.Limit(200), 500)},
	)
}

func ptr[T any](v T) *T { return &v }

// Run starts m and blocks until ctx ends, returning why it stopped.
func Run(ctx context.Context, m manager.Manager) error {
	if err := m.Start(ctx); err != nil {
		return fmt.Errorf("controllers: %w", err)
	}
	return nil
}
