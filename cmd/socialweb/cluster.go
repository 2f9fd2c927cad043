package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/tenant"
)

func newClusterCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Tenant clusters served by a local socialweb up",
	}
	cmd.AddCommand(newClusterKubeconfigCommand())
	return cmd
}

func newClusterKubeconfigCommand() *cobra.Command {
	var dataDir, namespace, output string
	var ttl time.Duration
	var noExpiry bool
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME",
		Short: "Print a kubeconfig for the owner of the tenant Cluster NAME",
		Long: `Mint a kubeconfig for the owner (spec.account) of the Cluster NAME, from the cluster's
client certificate authority in the data dir of the socialweb up that serves it: a client
certificate, no token and no exec plugin, valid for --ttl (60s to 24h, default 8h) or, with
--no-expiry, as long as the cluster's CA. It is what the gateway's getKubeconfig answers,
without a service-auth token: whoever can read the data dir holds the CA anyway.

The Cluster must have started once (status.server set); the kubeconfig works while it is
Ready. Written to stdout, or to --output with mode 0600.`,
		Example: `  kubectl apply -f - <<<'{"apiVersion":"socialweb.computer/v1alpha1","kind":"Cluster",
    "metadata":{"name":"demo"},"spec":{"account":"did:plc:...","name":"demo","running":true}}'
  kubectl wait --for=jsonpath='{.status.phase}'=Ready cluster/demo
  socialweb cluster kubeconfig demo -o demo.kubeconfig
  kubectl --kubeconfig demo.kubeconfig get namespaces`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if noExpiry && cmd.Flags().Changed("ttl") {
				return errors.New("--ttl and --no-expiry are exclusive")
			}
			if !noExpiry && (ttl < gateway.MinTTLSeconds*time.Second || ttl > gateway.MaxTTLSeconds*time.Second) {
				return fmt.Errorf("--ttl %s is outside %s..%s", ttl, gateway.MinTTLSeconds*time.Second, gateway.MaxTTLSeconds*time.Second)
			}
			kubeconfig := filepath.Join(dataDir, "kubeconfig")
			if _, err := os.Stat(kubeconfig); err != nil {
				return fmt.Errorf("kubeconfig %s: %w (give --data-dir of a socialweb up)", kubeconfig, err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
			}
			c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
			if err != nil {
				return err
			}
			var cl v1alpha1.Cluster
			err = c.Get(cmd.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &cl)
			switch {
			case apierrors.IsNotFound(err):
				return fmt.Errorf("cluster %s/%s not found", namespace, name)
			case err != nil:
				return fmt.Errorf("cluster %s/%s: %w (is socialweb up running on %s?)", namespace, name, err, dataDir)
			case !cl.DeletionTimestamp.IsZero():
				return fmt.Errorf("cluster %s/%s is being deleted", namespace, name)
			case cl.Status.Server == "":
				return fmt.Errorf("cluster %s/%s has not started yet (phase %q); wait for phase Ready", namespace, name, cl.Status.Phase)
			}
			k, root := tenant.Key{Namespace: cl.Namespace, Name: cl.Name}, filepath.Join(dataDir, "tenants")
			var kc []byte
			var until time.Time
			if noExpiry {
				kc, until, err = tenant.MintKubeconfigNoExpiry(root, k, cl.Spec.Account, cl.Status.Server)
			} else {
				kc, until, err = tenant.MintKubeconfig(root, k, cl.Spec.Account, cl.Status.Server, ttl)
			}
			if errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("cluster %s/%s has no certificate authority in %s (is this the data dir of the up that serves it?)", namespace, name, root)
			}
			if err != nil {
				return err
			}
			if output == "" {
				_, err = cmd.OutOrStdout().Write(kc)
				return err
			}
			if err := os.WriteFile(output, kc, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kubeconfig for %s of cluster %s/%s written to %s, valid until %s\n",
				cl.Spec.Account, namespace, name, output, until.UTC().Format(time.RFC3339))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", app.DefaultDataDir(), "data directory of the socialweb up that serves the cluster")
	f.StringVarP(&namespace, "namespace", "n", "default", "workspace (namespace) of the Cluster")
	f.StringVarP(&output, "output", "o", "", "write the kubeconfig to this file (mode 0600) instead of stdout")
	f.DurationVar(&ttl, "ttl", cluster.GetKubeconfigInputTTLSecondsDefault*time.Second, "how long the client certificate is valid (60s to 24h)")
	f.BoolVar(&noExpiry, "no-expiry", false, "valid as long as the cluster's certificate authority")
	return cmd
}
