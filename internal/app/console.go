package app

import (
	"context"
	"log/slog"

	"k8s.io/client-go/rest"

	"socialweb.computer/internal/console"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/tenant"
)

// ConsoleOff as up's console address serves no console.
const ConsoleOff = "off"

// startConsole serves the live console on addr, logged in with the core's admin token (the
// kubeconfig's); nil when addr is ConsoleOff. With tenants it also shows the nodes and
// pending pods inside the tenant clusters.
func startConsole(ctx context.Context, addr string, c *core.Core, pdsURL string, tenants *tenant.Manager, log *slog.Logger) (*console.Console, error) {
	if addr == ConsoleOff || addr == "" {
		return nil, nil
	}
	o := console.Options{Addr: addr, Token: c.RESTConfig.BearerToken, Config: c.RESTConfig, PDSURL: pdsURL,
		Logger: log.With("component", "console")}
	if tenants != nil {
		o.TenantConfig = func(ns, name string) (*rest.Config, error) { return tenants.AdminConfig(tenant.Key{Namespace: ns, Name: name}) }
	}
	return console.Start(ctx, o)
}
