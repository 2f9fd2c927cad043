package main

import (
	"os"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/substrate/jail"
)

// newGuestJailCommand is the init of a jailed guest (internal/substrate/jail): started by the
// deno substrate under unshare(1) as PID 1 of the guest's PID namespace, it builds the
// guest's root, joins its cgroups, drops to the guest's uid and runs the program. It is not
// meant to be run by hand.
func newGuestJailCommand() *cobra.Command {
	return &cobra.Command{
		Use:    jail.Command + " CONFIG",
		Short:  "Run a guest program jailed (started by the deno substrate)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			os.Exit(jail.Run(args[0]))
			return nil
		},
	}
}
