package main

import (
	"os"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/nodedns"
	"socialweb.computer/internal/substrate/node"
)

// newNodeAgentCommand is the process of a node guest of the node substrate
// (internal/substrate/node): it runs the node described in DIR until SIGTERM. The substrate
// starts it; it is not meant to be run by hand.
func newNodeAgentCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "node-agent DIR",
		Short:  "Run a node of the node substrate (started by the substrate)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(node.RunAgent(args[0]))
			return nil
		},
	}
}

// newNodeRootCommand is process 1 of a node's own namespaces (internal/substrate/node): it
// builds the node's root, pivots into it and reaps. The node agent starts it.
func newNodeRootCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "node-root DIR",
		Short:  "Process 1 of a node's namespaces (started by the node agent)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(node.RunRoot(args[0]))
			return nil
		},
	}
}

// newNodePodNetCommand is a node's pod network process (internal/substrate/node, podnet):
// the Node's pod CIDR into the CNI config, and the overlay to the cluster's other nodes. The
// node agent starts it inside the node's namespaces.
func newNodePodNetCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "node-podnet DIR",
		Short:  "A node's pod network and overlay (started by the node agent)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(node.RunPodNet(args[0]))
			return nil
		},
	}
}

// newNodeDNSCommand is the DNS server of a node (internal/nodedns: CoreDNS), serving the
// Corefile the node agent wrote, inside the node's namespaces. The agent starts it.
func newNodeDNSCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "node-dns COREFILE",
		Short:  "Run a node's DNS server (started by the node agent)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return nodedns.Run(args[0])
		},
	}
}
