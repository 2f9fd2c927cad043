package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/quota"
)

func newServeCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "serve", Short: "Run one service of the stack on its own"}
	cmd.AddCommand(newServeGatewayCommand())
	return cmd
}

func newServeGatewayCommand() *cobra.Command {
	var o app.GatewayOptions
	var dataDir, kubeconfig, level string
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run only the cluster gateway (com.publicdomainrelay.temp.cluster.* over XRPC)",
		Long: `Run the XRPC gateway for tenant clusters next to a socialweb whose data directory it
shares: Cluster objects in its core (DATA_DIR/kubeconfig), kubeconfigs minted from the cluster
CAs in DATA_DIR/tenants. Callers authenticate with service-auth tokens from their PDS
(com.atproto.server.getServiceAuth, aud the gateway's DID, lxm the method); --plc-url is the
did:plc directory their DIDs resolve through. 'socialweb up' runs a gateway itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			if kubeconfig == "" {
				kubeconfig = filepath.Join(dataDir, "kubeconfig")
			}
			if _, err := os.Stat(kubeconfig); err != nil {
				return fmt.Errorf("kubeconfig %s (is socialweb up running on --data-dir %s?): %w", kubeconfig, dataDir, err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
			}
			o.Core, o.TenantsRoot = cfg, filepath.Join(dataDir, "tenants")
			local, err := app.LocalAccountDID(filepath.Join(dataDir, "pds"))
			if err != nil {
				return err
			}
			if local != "" {
				o.Access.Allow = append([]string{local}, o.Access.Allow...)
			}
			o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
			gw, err := app.StartGateway(o)
			if err != nil {
				return err
			}
			defer gw.Close()
			// Checked once the gateway's own settings passed: a gateway that serves no one
			// is refused, saying how to name someone.
			if len(o.Access.Allow) == 0 && !o.Access.Open {
				return fmt.Errorf("no account to serve: %s has no local account; give --gateway-allow DID or --gateway-open", dataDir)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "gateway serving at %s (service DID %s, PLC %s)\n", gw.URL(), gw.DID(), o.PLCURL)
			fmt.Fprintln(cmd.ErrOrStderr(), app.AccessLine(o.Access))
			<-cmd.Context().Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", app.DefaultDataDir(), "data directory of the socialweb whose clusters this gateway serves")
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the core (default DATA_DIR/kubeconfig)")
	cmd.Flags().StringVar(&o.Addr, "listen", "127.0.0.1:0", "listen address (port 0 picks a free one)")
	cmd.Flags().StringVar(&o.PublicURL, "public-url", "", "URL clients reach the gateway at; its host names the service DID (default http://<listen address>)")
	cmd.Flags().StringArrayVar(&o.Audiences, "audience", nil, "another token audience to accept besides the gateway's own DID (repeatable)")
	cmd.Flags().StringVar(&o.PLCURL, "plc-url", "https://plc.directory", "did:plc directory callers' DIDs resolve through (socialweb up prints its own)")
	cmd.Flags().StringArrayVar(&o.Access.Allow, "gateway-allow", nil, "an account (DID) the gateway serves besides the data directory's local account, repeatable")
	cmd.Flags().BoolVar(&o.Access.Open, "gateway-open", false, "serve every account whose DID resolves, not only the allowed ones")
	addQuotaFlags(cmd, &o.Quota, false)
	cmd.Flags().StringVar(&level, "log-level", "info", "log level on stderr: debug, info, warn, error")
	return cmd
}

// addQuotaFlags adds the per-account quota flags: clusters (the gateway's), and with nodes
// the node host's, nodes and node-hours.
func addQuotaFlags(cmd *cobra.Command, l *quota.Limits, nodes bool) {
	d := quota.DefaultLimits()
	cmd.Flags().IntVar(&l.Clusters, "quota-clusters", d.Clusters, "clusters one account may hold through the gateway (0: no limit)")
	if nodes {
		cmd.Flags().IntVar(&l.Nodes, "quota-nodes", d.Nodes, "nodes one account may hold across its clusters (0: no limit)")
		cmd.Flags().IntVar(&l.NodeHours, "quota-node-hours", d.NodeHours, "node-hours one account's nodes may run in 30 days, rolling (0: no limit)")
	}
}
