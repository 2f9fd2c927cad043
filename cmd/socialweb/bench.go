package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/bench"
)

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure socialweb and print each figure beside its target"}
	var o bench.CoreOptions
	core := &cobra.Command{
		Use:   "core",
		Short: "up to ready, idle RSS, sequential creates, create-to-reconcile latency",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Progress = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "... "+format+"\n", a...) }
			return bench.Core(cmd.Context(), bench.Printer{W: cmd.OutOrStdout()}, o)
		},
	}
	core.Flags().IntVar(&o.Starts, "starts", 5, "up-to-ready runs")
	core.Flags().IntVar(&o.Creates, "creates", 1000, "sequential Infra creates")
	core.Flags().IntVar(&o.Latency, "latency-objects", 200, "objects for create-to-reconcile latency")
	core.Flags().DurationVar(&o.Idle, "idle", 10*time.Second, "idle time before reading RSS")
	var to bench.TenantOptions
	tenant := &cobra.Command{
		Use:   "tenant",
		Short: "tenant clusters: created to Ready, controlPlaneUp to Ready, idle RSS, wake from sleep (needs root: network namespace)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			to.Progress = func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), "... "+format+"\n", a...) }
			return bench.Tenant(cmd.Context(), bench.Printer{W: cmd.OutOrStdout()}, to)
		},
	}
	tenant.Flags().IntVar(&to.Clusters, "clusters", 5, "clusters created one after another (median reported)")
	tenant.Flags().DurationVar(&to.Idle, "idle", 30*time.Second, "idle time before reading RSS")
	tenant.Flags().IntVar(&to.Wakes, "wakes", 10, "sleep and wake cycles of one cluster (10 s of sleepAfter each; 0 skips)")
	cmd.AddCommand(core, tenant)
	return cmd
}
