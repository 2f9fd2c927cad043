package main

import (
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"socialweb.computer/internal/tenant/kube"
)

// newKubeCommand is the multi-call entry for the Kubernetes components a tenant cluster
// runs: `socialweb kube controlplane --spec FILE` (all of them in one process, what the
// Cluster controller starts), or one of apiserver, controller-manager, scheduler with its
// upstream flags, or the kubelet and kube-proxy a node substrate starts. It is the only import of k8s.io/kubernetes in this binary.
// componentFlags is pflag's global flag set as the linked-in components registered it at
// init (main replaces the global one for cobra).
var componentFlags *pflag.FlagSet

func newKubeCommand() *cobra.Command {
	return &cobra.Command{
		Use:                "kube COMPONENT [FLAGS]",
		Short:              "Run a Kubernetes component (" + joinNames() + ")",
		DisableFlagParsing: true,
		Args:               cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "-h" || args[0] == "--help" {
				return cmd.Help()
			}
			pflag.CommandLine = componentFlags
			os.Exit(kube.Main(args[0], args[1:], cmd.ErrOrStderr()))
			return nil
		},
	}
}

func joinNames() string {
	s := ""
	for i, n := range kube.Names() {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s
}
