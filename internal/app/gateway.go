package app

import (
	"fmt"
	"log/slog"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/gateway"
)

// GatewayOptions configure the cluster gateway.
type GatewayOptions struct {
	// Core is the API server holding the Cluster objects.
	Core *rest.Config
	// PLCURL is the did:plc directory token issuers are resolved through.
	PLCURL string
	// TenantsRoot is the tenant data directory (<data dir>/tenants).
	TenantsRoot string
	Addr        string
	PublicURL   string
	Audiences   []string
	Logger      *slog.Logger
}

// StartGateway starts the XRPC gateway for tenant clusters (docs/gateway.md).
func StartGateway(o GatewayOptions) (*gateway.Server, error) {
	c, err := client.NewWithWatch(o.Core, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("gateway: core client: %w", err)
	}
	return gateway.Start(gateway.Config{
		Client: c, Directory: gateway.NewDirectory(o.PLCURL), TenantsRoot: o.TenantsRoot,
		Addr: o.Addr, PublicURL: o.PublicURL, Audiences: o.Audiences, Logger: o.Logger,
	})
}
