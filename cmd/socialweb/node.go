package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
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

// newNodeCommand is the operator's commands of the node substrate.
func newNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Nodes of the node substrate on this host",
	}
	cmd.AddCommand(newNodeSweepCommand())
	return cmd
}

// NodeSweepDirError is a node sweep without exactly one of --data-dir and --state-dir.
type NodeSweepDirError struct{}

func (NodeSweepDirError) Error() string {
	return "name the nodes to sweep: --data-dir (up's) or --state-dir (a bidder's), one of them"
}

// newNodeSweepCommand removes the host state of the nodes of one data dir (or bidder state
// dir) that no longer run; --release stops the running ones first. Only that dir's own
// nodes: another up's on the same host are not touched (docs/nodes.md).
func newNodeSweepCommand() *cobra.Command {
	var dataDir, stateDir string
	var release bool
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Remove the host state (netns, veth, iptables, cgroups, run dir) of a data dir's nodes that no longer run",
		Long: `Removes what nodes of one data dir left on this host after they died with the process
that ran them: network namespace, veth, INPUT rules, egress chain and overlay forwarding,
cgroups, run dir, mounts and left processes. Running nodes are kept, unless --release, which
stops them first (a host, or a test, giving its nodes up). up and the bidder sweep by
themselves when they start; run this while neither runs on the dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var dir string
			switch {
			case (dataDir == "") == (stateDir == ""):
				return NodeSweepDirError{}
			case dataDir != "":
				dir = app.LocalNodeStateDir(dataDir)
			default:
				dir = filepath.Join(stateDir, "guests") // as the bidder command keeps them
			}
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				fmt.Fprintf(cmd.OutOrStdout(), "no nodes: %s does not exist\n", dir)
				return nil
			}
			swept, err := node.SweepStateDir(cmd.Context(), dir, release)
			for _, sw := range swept {
				fmt.Fprintln(cmd.OutOrStdout(), sw)
			}
			if len(swept) == 0 && err == nil {
				fmt.Fprintln(cmd.OutOrStdout(), "nothing to sweep")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "up's data dir: its local node bidder's nodes")
	cmd.Flags().StringVar(&stateDir, "state-dir", "", "a node bidder's --state-dir (socialweb bidder --substrate node): its guests")
	cmd.Flags().BoolVar(&release, "release", false, "stop the running nodes too, then remove their host state")
	return cmd
}
