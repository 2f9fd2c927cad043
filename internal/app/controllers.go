package app

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"log/slog"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"socialweb.computer/internal/controllers/cluster"
	"socialweb.computer/internal/controllers/infra"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/tenant"
)

// ControllerOptions configure the controllers of a process.
type ControllerOptions struct {
	MetricsAddr        string
	LeaderElection     bool
	LeaderElectionNS   string
	Observer           ctrlmanager.ReconcileObserver
	SkipNameValidation bool
	Logger             *slog.Logger
	// Tenants runs tenant clusters' control planes; nil means this process does not, and
	// TenantsUnavailable (reported on every Cluster) says why.
	Tenants            *tenant.Manager
	TenantsUnavailable string
}

// NewControllers returns a manager with every socialweb controller registered against cfg.
func NewControllers(cfg *rest.Config, o ControllerOptions) (manager.Manager, error) {
	m, err := ctrlmanager.New(cfg, ctrlmanager.Options{
		MetricsAddr:             o.MetricsAddr,
		LeaderElection:          o.LeaderElection,
		LeaderElectionNamespace: o.LeaderElectionNS,
		SkipNameValidation:      o.SkipNameValidation,
		Logger:                  o.Logger,
	})
	if err != nil {
		return nil, err
	}
	if err := infra.Setup(m, o.Observer); err != nil {
		return nil, err
	}
	unavailable := o.TenantsUnavailable
	if unavailable == "" {
		unavailable = "this controller process runs no tenant control planes"
	}
	if err := cluster.Setup(m, o.Observer, o.Tenants, unavailable); err != nil {
		return nil, err
	}
	return m, nil
}

// RunControllers runs the controllers against cfg until ctx ends.
func RunControllers(ctx context.Context, cfg *rest.Config, o ControllerOptions) error {
	m, err := NewControllers(cfg, o)
	if err != nil {
		return err
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
