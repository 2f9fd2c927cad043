package app

import (
	"context"
	"errors"
	"log/slog"

	"k8s.io/client-go/rest"

	"socialweb.computer/internal/console"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/tenant"
)

// ConsoleOff as up's console address serves no console.
const ConsoleOff = "off"

// startConsole serves the live console on addr, logged in with the core's admin token (the
// kubeconfig's); nil when addr is ConsoleOff. With tenants it also shows the nodes and
// pending pods inside the tenant clusters.
func startConsole(ctx context.Context, addr string, c *core.Core, root, pdsURL string, tenants *tenant.Manager, log *slog.Logger) (*console.Console, error) {
	if addr == ConsoleOff || addr == "" {
		return nil, nil
	}
	o := console.Options{Addr: addr, Token: c.RESTConfig.BearerToken, Config: c.RESTConfig, PDSURL: pdsURL,
		Logger: log.With("component", "console"), GuestLogs: localGuestLogs(root)}
	if tenants != nil {
		o.TenantConfig = func(ns, name string) (*rest.Config, error) {
			return tenants.AdminConfig(tenant.Key{Namespace: ns, Name: name})
		}
	}
	return console.Start(ctx, o)
}

// localGuestLogs reads the log of the guest up's own bidders booted for an accept: the deno
// bidder's or the node bidder's guest dir (startLocalBidder, startLocalNodeBidder) named by
// bidder.GuestID. A guest of another bidder has no log here (substrate.ErrNotFound).
func localGuestLogs(root string) func(context.Context, string, int) ([]byte, error) {
	stores := []guestproc.Store{{Root: guestsDir(localBidderDir(root))}, {Root: guestsDir(localNodeBidderDir(root))}}
	return func(_ context.Context, acceptURI string, tail int) ([]byte, error) {
		id := bidder.GuestID(acceptURI)
		for _, s := range stores {
			b, err := substrate.StateDirLogs(s, "guest", id, guestproc.LogFile, tail)
			if !errors.Is(err, substrate.ErrNotFound) {
				return b, err
			}
		}
		return nil, substrate.ErrNotFound
	}
}
