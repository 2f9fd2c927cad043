package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/app"
)

func newControllersCommand() *cobra.Command {
	var kubeconfig, kubecontext, level, plcURL string
	var o app.ControllerOptions
	cmd := &cobra.Command{
		Use:   "controllers --kubeconfig FILE",
		Short: "Run only the controllers against an existing Kubernetes-compatible API server",
		Long: `Run every socialweb controller against the API server a kubeconfig names: another
socialweb's embedded core, a Kubernetes cluster or a kcp workspace with the socialweb.computer
CRDs installed. Use --leader-elect when more than one replica runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kubeconfig == "" {
				return fmt.Errorf("--kubeconfig is required")
			}
			if _, err := os.Stat(kubeconfig); err != nil {
				return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
			}
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
				&clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
			}
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			if plcURL != "" {
				o.MarketDirectory = &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true}
			}
			o.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
			fmt.Fprintf(cmd.ErrOrStderr(), "running controllers against %s\n", cfg.Host)
			return app.RunControllers(cmd.Context(), cfg, o)
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server to run against (required)")
	cmd.Flags().StringVar(&kubecontext, "context", "", "kubeconfig context (default: its current context)")
	cmd.Flags().StringVar(&o.MetricsAddr, "metrics-addr", "0", "address for Prometheus metrics, e.g. 127.0.0.1:9090 (0 turns it off)")
	cmd.Flags().BoolVar(&o.LeaderElection, "leader-elect", false, "take a Lease before reconciling (needs coordination.k8s.io)")
	cmd.Flags().StringVar(&o.LeaderElectionNS, "leader-elect-namespace", "default", "namespace of the leader Lease")
	cmd.Flags().StringArrayVar(&o.MarketSources, "market-follow", nil, "firehose of a PDS (or relay) URL the requester follows besides its repos' PDSes, repeatable: bidders there")
	cmd.Flags().StringVar(&plcURL, "plc-url", "", "did:plc directory that resolves DIDs to their PDS for records a --market-follow relay does not serve (empty: none)")
	cmd.Flags().StringVar(&level, "log-level", "info", "log level on stderr: debug, info, warn, error")
	return cmd
}
