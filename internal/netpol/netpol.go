// Package netpol enforces NetworkPolicy on a tenant cluster's node: it runs the upstream
// reference implementation, sigs.k8s.io/kube-network-policies, inside the node's network
// namespace (`socialweb kube netpol`, started by the node agent beside the kubelet).
//
// The engine puts the first packet of every new connection to or from a pod of this node
// that some policy selects into an nfqueue, decides it in user space from the cluster's
// NetworkPolicies, Namespaces and Pods, and accepts or drops it; established flows then
// pass in the kernel. It fails closed: with the engine down, connections to selected pods
// are dropped, not let through. Pods no policy selects are never queued.
//
// It runs with the node's own credentials (system:node:<name>); the tenant control plane
// grants the group system:nodes read of pods, namespaces and network policies for it
// (internal/tenant/kube, the bootstrap hooks).
package netpol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// Options configure one node's engine.
type Options struct {
	// Kubeconfig is the node's kubeconfig (its client certificate).
	Kubeconfig string
	// NodeName is the node's name: only its own pods' traffic is decided here.
	NodeName string
	// QueueID is the nfqueue number (the node's network namespace is its own, so the
	// default never collides with another node's).
	QueueID int
}

// DefaultQueueID is the nfqueue the engine uses in a node.
const DefaultQueueID = 100

// TableName is the nftables table of the engine's rules in the node's namespace.
const TableName = "socialweb-netpol"

// Run enforces NetworkPolicy until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.Kubeconfig == "" || o.NodeName == "" {
		return errors.New("netpol: --kubeconfig and --node-name are required")
	}
	if o.QueueID == 0 {
		o.QueueID = DefaultQueueID
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		return fmt.Errorf("netpol: kubeconfig %s: %w", o.Kubeconfig, err)
	}
	cfg.UserAgent = "socialweb-netpol/" + o.NodeName
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	c, err := networkpolicy.NewController(cs,
		f.Networking().V1().NetworkPolicies(),
		f.Core().V1().Namespaces(),
		f.Core().V1().Pods(),
		nil,      // nodes: only for admin network policies, not served
		nil,      // admin network policy client
		nil, nil, // admin and baseline admin network policies: alpha APIs, not served
		networkpolicy.Config{
			FailOpen:    false,
			QueueID:     o.QueueID,
			NodeName:    o.NodeName,
			NFTableName: TableName,
			NRIdisabled: true, // containerd here has no NRI; pod IPs come from the apiserver
			// The conntrack race it works around is fixed in kernels 6.12 and later, but
			// the fix costs only DNS packets an early hook: keep it on for older hosts.
			NetfilterBug1766Fix: true,
		})
	if err != nil {
		return fmt.Errorf("netpol: %w", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	f.Start(ctx.Done())
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("netpol: the engine stopped: %w", err)
	}
}

// NewCommand is `socialweb kube netpol`.
func NewCommand() *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "netpol --kubeconfig FILE --node-name NAME",
		Short: "Enforce NetworkPolicy for the pods of one node (sigs.k8s.io/kube-network-policies)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return Run(ctx, o)
		},
	}
	cmd.Flags().StringVar(&o.Kubeconfig, "kubeconfig", "", "the node's kubeconfig")
	cmd.Flags().StringVar(&o.NodeName, "node-name", "", "the node's name")
	cmd.Flags().IntVar(&o.QueueID, "nfqueue-id", DefaultQueueID, "the nfqueue number")
	return cmd
}
