package app

import (
	"context"
	"log/slog"

	"socialweb.computer/internal/console"
	"socialweb.computer/internal/core"
)

// ConsoleOff as up's console address serves no console.
const ConsoleOff = "off"

// startConsole serves the live console on addr, logged in with the core's admin token (the
// kubeconfig's); nil when addr is ConsoleOff.
func startConsole(ctx context.Context, addr string, c *core.Core, pdsURL string, log *slog.Logger) (*console.Console, error) {
	if addr == ConsoleOff || addr == "" {
		return nil, nil
	}
	return console.Start(ctx, console.Options{Addr: addr, Token: c.RESTConfig.BearerToken, Config: c.RESTConfig, PDSURL: pdsURL,
		Logger: log.With("component", "console")})
}
