package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/hostcheck"
	"socialweb.computer/internal/substrate/node"
)

func newCheckHostCommand() *cobra.Command {
	c := hostcheck.Config{}
	cmd := &cobra.Command{
		Use:   "check-host",
		Short: "Say what this host can run (deno guests, vm guests, namespace and vm nodes, tenant clusters) and what to install or pass in",
		Long: `Check every requirement of every substrate and of the tenant clusters on this host, as
HOLDS, MISSING (with the command that installs it) or MUST BE PASSED IN (a flag or file only
the operator supplies), one line each, grouped by area, then one summary line per area.
The flags are up's: the check is of what up would run with them. It reads the host and
starts nothing. Exits non-zero when a requirement the configuration needs does not hold.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Validate(); err != nil {
				return err
			}
			h := hostcheck.Probe(c)
			rows := hostcheck.Check(h, c)
			if err := hostcheck.Print(cmd.OutOrStdout(), h, c, rows); err != nil {
				return err
			}
			return hostcheck.Err(rows)
		},
	}
	addHostConfigFlags(cmd, &c)
	return cmd
}

// addHostConfigFlags are up's flags that decide what the host needs (hostcheck.Config).
func addHostConfigFlags(cmd *cobra.Command, c *hostcheck.Config) {
	f := cmd.Flags()
	f.BoolVar(&c.Deno, "deno", true, "deno guests run (up's local bidder)")
	f.BoolVar(&c.Tenants, "tenants", true, "tenant clusters run, and with them the local node bidder")
	f.StringVar(&c.NodeFlavour, "node-flavour", node.FlavourAuto, "as up's: namespace, vm or auto")
	f.StringVar(&c.VMImage, "vm-image", filepath.Join(app.DefaultDataDir(), "images", "vm"), "as up's: the image `socialweb image build` wrote")
	f.StringVar(&c.NodeRuntime, "node-runtime", "", "as up's: a node runtime directory, \"host\", or empty for node-runtime beside this binary, else the host's")
	f.StringVar(&c.RegistryConfig, "node-registry-config", "", "as up's: a directory in containerd's hosts layout")
	f.StringVar(&c.TenantAdvertise, "tenant-advertise-address", "", "as up's: the tenant apiservers' advertise address")
	f.StringSliceVar(&c.EgressAllow, "node-egress-allow", nil, "as up's: CIDRs pods may reach although the deny list holds them")
}
