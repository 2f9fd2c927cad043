package app

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"socialweb.computer/internal/controllers/atprotorecord"
	"socialweb.computer/internal/controllers/atprotorecordwatch"
	"socialweb.computer/internal/controllers/atprotorepo"
	"socialweb.computer/internal/controllers/cluster"
	"socialweb.computer/internal/controllers/computecontract"
	"socialweb.computer/internal/controllers/infra"
	"socialweb.computer/internal/controllers/infracollection"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/controllers/nodehost"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/watch"
)

// ControllerOptions configure the controllers of a process.
type ControllerOptions struct {
	MetricsAddr string
	// MetricsSecure serves metrics over HTTPS behind the API server's authentication and
	// authorization; MetricsCertDir holds its tls.crt and tls.key (none: self-signed).
	MetricsSecure  bool
	MetricsCertDir string
	// HealthAddr serves /healthz and /readyz ("" or "0": off).
	HealthAddr string
	// GracefulShutdown bounds how long reconciles in flight get once the process is asked to
	// stop (0: controller-runtime's 30 s).
	GracefulShutdown time.Duration
	LeaderElection   bool
	LeaderElectionNS string
	// StateNamespace holds what the controllers keep of their own (the requester's market
	// index); empty: the leader election's namespace.
	StateNamespace     string
	Observer           ctrlmanager.ReconcileObserver
	SkipNameValidation bool
	Logger             *slog.Logger
	// PDS is the embedded PDS that AtprotoRepos with spec.local live on; nil when the
	// process runs none (local repos then report Unreachable).
	PDS *pds.Server
	// Broker fans record changes seen by AtprotoRecordWatches out to other controllers;
	// nil makes a new one.
	Broker *watch.Broker
	// Resolver holds every repo session; nil makes a new one (its Client is set here).
	Resolver *repos.Resolver
	// Tenants runs tenant clusters' control planes; nil means this process does not, and
	// TenantsUnavailable (reported on every Cluster) says why.
	Tenants            *tenant.Manager
	TenantsUnavailable string
	// MarketSources are firehoses (PDS or relay URLs) the requester follows besides its
	// repos' own PDSes, to see the offerings, bids, receipts and events of bidders elsewhere.
	MarketSources []string
	// MarketDirectory resolves DIDs to their PDS for records a market source does not serve
	// (a relay); nil means the embedded PDS's did:plc directory when PDS is set.
	MarketDirectory identity.Directory
	// NodeBidWindow is the bid window of node contracts (nodeclaim.Options.BidWindow); 0
	// leaves the market's default.
	NodeBidWindow time.Duration
	// Quota is what one account may hold; the node host enforces its nodes and node-hours
	// quotas.
	Quota quota.Limits
}

// Leader election (--leader-elect), for a Role in the Deployment's namespace generated into
// config/rbac/role.yaml (kustomize sets the namespace): client-go's Lease lock gets, creates
// and updates one Lease (an update also releases it on shutdown). The lock is made without
// an event recorder (manager.newLeaseLock), so no leader-change Event is written: the
// process logs "leading" instead, and needs no access to Events.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=socialweb-system,roleName=socialweb-leader-election

// NewControllers returns a manager with every socialweb controller registered against cfg.
func NewControllers(cfg *rest.Config, o ControllerOptions) (manager.Manager, error) {
	m, err := ctrlmanager.New(cfg, ctrlmanager.Options{
		MetricsAddr:             o.MetricsAddr,
		MetricsSecure:           o.MetricsSecure,
		MetricsCertDir:          o.MetricsCertDir,
		HealthAddr:              o.HealthAddr,
		GracefulShutdown:        o.GracefulShutdown,
		LeaderElection:          o.LeaderElection,
		LeaderElectionNamespace: o.LeaderElectionNS,
		SkipNameValidation:      o.SkipNameValidation,
		Logger:                  o.Logger,
	})
	if err != nil {
		return nil, err
	}
	res := o.Resolver
	if res == nil {
		res = &repos.Resolver{}
	}
	res.PDS, res.Client = o.PDS, m.GetClient()
	if o.MarketDirectory == nil && o.PDS != nil {
		o.MarketDirectory = o.PDS.Directory()
	}
	broker := o.Broker
	if broker == nil {
		broker = &watch.Broker{}
	}
	if err := infra.Setup(m, res, broker, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	if err := infracollection.Setup(m, res, broker, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	if err := atprotorepo.Setup(m, res, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	if err := atprotorecord.Setup(m, res, broker, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	if err := atprotorecordwatch.Setup(m, res, broker, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	// The requester's index is kept in the controllers' own namespace, beside their Lease.
	stateNS := o.StateNamespace
	if stateNS == "" {
		stateNS = ctrlmanager.LeaderElectionNamespace(o.LeaderElectionNS)
	}
	store := &computecontract.SecretStore{Client: m.GetClient(), Reader: m.GetAPIReader(),
		Key: client.ObjectKey{Namespace: stateNS, Name: computecontract.IndexSecretName}}
	if err := computecontract.Setup(m, res, o.PDS, o.MarketSources, o.MarketDirectory, store, o.Logger, o.Observer); err != nil {
		return nil, err
	}
	nco := nodeclaim.Options{Log: o.Logger, Observer: o.Observer, BidWindow: o.NodeBidWindow}
	if o.Tenants != nil {
		nco.Bundler, nco.Nodes = o.Tenants, o.Tenants
	}
	if err := nodeclaim.Setup(m, nco); err != nil {
		return nil, err
	}
	unavailable := o.TenantsUnavailable
	if unavailable == "" {
		unavailable = "this controller process runs no tenant control planes"
	}
	if err := cluster.Setup(m, o.Observer, o.Tenants, unavailable); err != nil {
		return nil, err
	}
	// The node host reads tenant clusters' pods, so it runs only where their control
	// planes do.
	if o.Tenants != nil {
		if err := nodehost.Setup(m, nodehost.Options{Tenants: o.Tenants, Quota: o.Quota, Log: o.Logger, Observer: o.Observer}); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RunControllers runs the controllers against cfg until ctx ends, or until they cannot go
// on (a permission the API server refuses, caches that never sync).
func RunControllers(ctx context.Context, cfg *rest.Config, o ControllerOptions) error {
	m, err := NewControllers(cfg, o)
	if err != nil {
		return err
	}
	if !o.LeaderElection {
		log := o.Logger
		if log == nil {
			log = slog.Default()
		}
		ctrlmanager.WarnSingleReplica(ctx, cfg, o.LeaderElectionNS, log)
	}
	return ctrlmanager.Run(ctx, m)
}

func randomPassword() (string, error) {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
