package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/quota"
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
	// Access is who the gateway serves (docs/gateway.md, Who may call).
	Access gateway.Access
	// Quota is what one account may hold; the gateway enforces its clusters quota.
	Quota  quota.Limits
	Logger *slog.Logger
}

// StartGateway starts the XRPC gateway for tenant clusters (docs/gateway.md).
func StartGateway(o GatewayOptions) (*gateway.Server, error) {
	c, err := client.NewWithWatch(o.Core, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("gateway: core client: %w", err)
	}
	return gateway.Start(gateway.Config{
		Client: c, Directory: gateway.NewDirectory(o.PLCURL), TenantsRoot: o.TenantsRoot,
		Addr: o.Addr, PublicURL: o.PublicURL, Audiences: o.Audiences, Access: o.Access, WatchAccess: true, Quota: o.Quota,
		Logger: o.Logger,
	})
}

// LocalAccountDID is the DID of the local account `up` made in the PDS data directory
// pdsDir, "" when up has not made one there. Only the DID is read.
func LocalAccountDID(pdsDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(pdsDir, "account.json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var a struct {
		DID string `json:"did"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return "", fmt.Errorf("%s: %w", filepath.Join(pdsDir, "account.json"), err)
	}
	return a.DID, nil
}

// AccessLine says whom a gateway serves, for the operator.
func AccessLine(a gateway.Access) string {
	if a.Open {
		return "gateway admits every account whose DID resolves (--gateway-open)"
	}
	return fmt.Sprintf("gateway admits %d account(s): %v, and those of the GatewayAccess objects in namespace %s, live (--gateway-allow DID adds one, --gateway-open admits any)", len(a.Allow), a.Allow, gateway.AccessNamespace)
}
