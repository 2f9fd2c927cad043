package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/workspace"
)

func newWorkspaceCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workspace",
		Short: "Manage workspaces (a workspace is a namespace)",
	}
	cmd.AddCommand(newWorkspaceDeleteCommand())
	return cmd
}

func newWorkspaceDeleteCommand() *cobra.Command {
	var kubeconfig, kubecontext string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete every socialweb object of a workspace, deployments first",
		Long: `Delete every object of the socialweb.computer group in the workspace (namespace) NAME,
in the order the deployments need: Infras and EphemeralInfras first (reported as
"<n> deployment(s) releasing" until their contracts are Released or Failed), then the
remaining ComputeContracts, then the records and watches, then the repos and Secrets.
The controllers must be running (socialweb up or socialweb controllers): the finalizers
that release the guests are theirs. Exits 0 once nothing is left; after --timeout it fails
naming what is still there.

The gateway's workspace (gateway) is the gateway root: it holds the node deployments of
every tenant Cluster, so its deletion first deletes every Cluster and NodeClaim of every
workspace and waits until they are gone ("<n> cluster(s) and <m> node claim(s) going"),
then goes on as above; it does not go past the contracts while one still holds a guest.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := workspace.CheckName(args[0]); err != nil {
				return err
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: want a positive duration", timeout)
			}
			if _, err := os.Stat(kubeconfig); err != nil {
				return fmt.Errorf("kubeconfig %s: %w (give --kubeconfig, or start socialweb up)", kubeconfig, err)
			}
			cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
				&clientcmd.ConfigOverrides{CurrentContext: kubecontext}).ClientConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
			}
			cfg.QPS, cfg.Burst = -1, 0
			scheme := manager.Scheme()
			c, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			if err := workspace.Delete(ctx, c, scheme, args[0], workspace.Options{Progress: out,
				Root: args[0] == nodeclaim.DefaultContractNamespace}); err != nil {
				return err
			}
			fmt.Fprintf(out, "workspace %s deleted\n", args[0])
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", filepath.Join(app.DefaultDataDir(), "kubeconfig"), "kubeconfig of the API server")
	f.StringVar(&kubecontext, "context", "", "kubeconfig context (default: its current context)")
	f.DurationVar(&timeout, "timeout", 5*time.Minute, "give up after this long, naming what is left")
	return cmd
}
