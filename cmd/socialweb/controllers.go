package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/app"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
)

func newControllersCommand() *cobra.Command {
	var kubeconfig, kubecontext, level, plcURL string
	var o app.ControllerOptions
	cmd := &cobra.Command{
		Use:   "controllers [--kubeconfig FILE]",
		Short: "Run only the controllers against an existing Kubernetes-compatible API server",
		Long: `Run every socialweb controller against the API server a kubeconfig names (another
socialweb's embedded core, a Kubernetes cluster or a kcp workspace with the socialweb.computer
CRDs installed), or, without --kubeconfig, the cluster the pod runs in.

Use --leader-elect when more than one replica runs: the leader gives its Lease up when it
stops, so another takes over within seconds. A permission the API server refuses is reported
once, naming the verb and resource to grant (see config/rbac), and the process exits 1.
SIGTERM or SIGINT stops it within --graceful-shutdown (plus a few seconds to give the Lease
up); a second signal ends it at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := controllersConfig(kubeconfig, kubecontext)
			if err != nil {
				return err
			}
			if o.GracefulShutdown <= 0 {
				return fmt.Errorf("--graceful-shutdown %s: want a positive duration", o.GracefulShutdown)
			}
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			if plcURL != "" {
				o.MarketDirectory = &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true}
			}
			logOut := &closableWriter{w: cmd.ErrOrStderr()}
			o.Logger = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: l}))
			// The manager's own stop is bounded by the grace period plus the Lease release;
			// this is the backstop for everything before and around it.
			exitAfterStop(cmd.Context(), o.GracefulShutdown+ctrlmanager.StopSlack+time.Second)
			fmt.Fprintf(cmd.ErrOrStderr(), "running controllers against %s\n", cfg.Host)
			err = app.RunControllers(cmd.Context(), cfg, o)
			// The manager's goroutines may still log its stop ("error received after stop
			// sequence was engaged"): the error that ended it is the last line a user sees.
			logOut.Close()
			return err
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the API server to run against (default: the in-cluster config of the pod)")
	cmd.Flags().StringVar(&kubecontext, "context", "", "kubeconfig context (default: its current context)")
	cmd.Flags().StringVar(&o.MetricsAddr, "metrics-addr", "0", "address for Prometheus metrics, e.g. 127.0.0.1:9090 (0 turns it off)")
	cmd.Flags().BoolVar(&o.MetricsSecure, "metrics-secure", false, "serve metrics over HTTPS to callers the API server authenticates and authorizes (get on the /metrics non-resource URL)")
	cmd.Flags().StringVar(&o.MetricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for --metrics-secure (empty: a self-signed pair made at start)")
	cmd.Flags().StringVar(&o.HealthAddr, "health-addr", "0", "address for /healthz (liveness) and /readyz (caches synced), e.g. :8081 (0 turns it off)")
	cmd.Flags().DurationVar(&o.GracefulShutdown, "graceful-shutdown", ctrlmanager.DefaultGracefulShutdown, "time reconciles in flight get to end after SIGTERM; keep it under the pod's terminationGracePeriodSeconds")
	cmd.Flags().BoolVar(&o.LeaderElection, "leader-elect", false, "take a Lease before reconciling (needs coordination.k8s.io); run more than one replica only with it")
	cmd.Flags().StringVar(&o.LeaderElectionNS, "leader-elect-namespace", "", "namespace of the leader Lease (default: the pod's namespace in a cluster, else default)")
	cmd.Flags().StringArrayVar(&o.MarketSources, "market-follow", nil, "firehose of a PDS (or relay) URL the requester follows besides its repos' PDSes, repeatable: bidders there")
	cmd.Flags().StringVar(&plcURL, "plc-url", "", "did:plc directory that resolves DIDs to their PDS for records a --market-follow relay does not serve (empty: none)")
	cmd.Flags().StringVar(&level, "log-level", "info", "log level on stderr: debug, info, warn, error")
	return cmd
}

// controllersConfig is the REST config of the kubeconfig when one is given, else the pod's
// in-cluster config.
func controllersConfig(kubeconfig, kubecontext string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster (%v): give --kubeconfig FILE", err)
		}
		return cfg, nil
	}
	if _, err := os.Stat(kubeconfig); err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
		&clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// exitAfterStop bounds a stop: once the first SIGTERM or SIGINT ends ctx, the process exits
// when a second signal comes or, should the controllers not have returned by then (a
// request to an API server that never answers, at start-up before the manager runs), after
// bound. A kubelet's SIGKILL comes only after the pod's grace period; this comes first.
func exitAfterStop(ctx context.Context, bound time.Duration) {
	ch := make(chan os.Signal, 1)
	go func() {
		<-ctx.Done()
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		select {
		case <-ch:
			fmt.Fprintln(os.Stderr, "socialweb: second signal: exiting without waiting for the controllers to stop")
		case <-time.After(bound):
			fmt.Fprintf(os.Stderr, "socialweb: controllers did not stop within %s of the signal: exiting\n", bound)
		}
		os.Exit(1)
	}()
}

// closableWriter passes writes on until Close, and drops them after.
type closableWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (c *closableWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return len(p), nil
	}
	return c.w.Write(p)
}

// Close makes later writes no-ops; a write in progress ends first.
func (c *closableWriter) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}
