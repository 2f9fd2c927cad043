// Command socialweb is the one binary of socialweb-computer: the embedded stack (`up`),
// the controllers alone against any Kubernetes API server (`controllers`), and the tools
// around them. Every subcommand has --help; errors are one line and a non-zero exit.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	// The Kubernetes version in every build, `go run` included (hack/build.sh also stamps
	// it at link time).
	_ "socialweb.computer/internal/kubeversion"
	"socialweb.computer/internal/netpol/podgate"
	"socialweb.computer/internal/substrate/jail"
)

func main() {
	// `socialweb guest-jail CONFIG` is the init of a jailed deno guest (internal/substrate/jail),
	// started by the deno substrate; it is answered before anything else is set up.
	jail.MaybeRun()
	// Under the node's CNI plugin's name (a link in a node's CNI bin dir when the small
	// socialweb-cni-netpol is not beside this binary), this binary is that plugin.
	if podgate.IsPlugin() {
		podgate.PluginMain()
		return
	}
	// The Kubernetes components linked in for `socialweb kube` register flags such as
	// --version on pflag's global set at init; cobra would show them on every command. Each
	// kube component parses its own flag sets, so the global one is not needed by cobra; it is
	// kept for `socialweb kube`, whose kubelet copies flags such as --version from it.
	componentFlags = pflag.CommandLine
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	// controller-runtime's clients log through its global logger; a command that uses one
	// without a manager would otherwise get a stack trace 30 s in saying it was never set.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.Default().Handler()))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "socialweb: %s\n", oneLine(err))
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "socialweb",
		Short:         "Rent compute on a decentralized market and declare it in your atproto repo",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newUpCommand(), newControllersCommand(), newVersionCommand(), newBenchCommand(), newPDSCommand(), newImageCommand(), newKubeCommand(), newBidderCommand(), newServeCommand(), newNodeCommand(), newNodeAgentCommand(), newNodeRootCommand(), newNodeDNSCommand(), newNodePodNetCommand(), newWorkspaceCommand(), newClusterCommand(), newCheckHostCommand(), newInstallDepsCommand())
	return root
}

// oneLine keeps an error to one line: the first line of a multi-line message is the one a
// user can act on; the rest belongs in the log.
func oneLine(err error) string {
	s := strings.TrimSpace(err.Error())
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
