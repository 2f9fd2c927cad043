package main

import (
	"path/filepath"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/substrate/vm/image"
)

func newImageCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Guest images of the vm substrate"}
	var out string
	build := &cobra.Command{
		Use:   "build",
		Short: "Build the vm guest's kernel and initramfs from Debian packages, with progress",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return image.BuildImage(cmd.Context(), out, cmd.OutOrStdout())
		},
	}
	build.Flags().StringVar(&out, "out", filepath.Join(app.DefaultDataDir(), "images", "vm"), "directory for vmlinuz, initrd.gz and image.json")
	cmd.AddCommand(build)
	return cmd
}
