package main

import (
	"fmt"

	"github.com/spf13/cobra"
	kubeversion "k8s.io/component-base/version"

	"socialweb.computer/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary and of the Kubernetes built into it",
		Long: `Print the version of this binary (the module version, with the VCS revision when the
build recorded one), then the Kubernetes version its API server and tenant control planes
serve at /version: both from the module's build info, so go run, go build and hack/build.sh
agree.`,
		Args: cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), version.String())
			fmt.Fprintf(cmd.OutOrStdout(), "kubernetes %s (the API server and the tenant control planes)\n", kubeversion.Get().GitVersion)
		},
	}
}
