// Package kube holds the entry points of the Kubernetes control-plane components, built
// from k8s.io/kubernetes into the socialweb binary (`socialweb kube <component>`). It is the
// only package that imports k8s.io/kubernetes; everything else in internal/tenant is plain Go
// that builds in seconds.
package kube

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubeletapp "k8s.io/kubernetes/cmd/kubelet/app"

	"socialweb.computer/internal/netpol"
)

// Components are the names `socialweb kube` answers to.
var components = map[string]func() *cobra.Command{
	"apiserver":          apiserverapp.NewAPIServerCommand,
	"controller-manager": cmapp.NewControllerManagerCommand,
	"scheduler":          func() *cobra.Command { return schedulerapp.NewSchedulerCommand() },
	"controlplane":       newControlPlaneCommand,
	"kubelet":            func() *cobra.Command { return kubeletapp.NewKubeletCommand(context.Background()) },
	"netpol":             netpol.NewCommand,
}

// Names lists the components in order.
func Names() []string {
	var n []string
	for k := range components {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Main runs one component with its own flags (args excludes the component name) and returns
// the process exit code. Each upstream component owns its process: it installs its own signal
// handling and logging, so Main is called once per process.
func Main(component string, args []string, stderr io.Writer) int {
	mk, ok := components[component]
	if !ok {
		fmt.Fprintf(stderr, "socialweb kube: unknown component %q (want one of %v)\n", component, Names())
		return 2
	}
	cmd := mk()
	cmd.SetArgs(args)
	if component == "kubelet" {
		// In the node, beside the kubelet: the sweep of deleted volumes' directories.
		startVolumeSweeper(context.Background(), args)
	}
	if err := cmd.Execute(); err != nil {
		fmt.Fprintf(stderr, "socialweb kube %s: %v\n", component, err)
		return 1
	}
	return 0
}
