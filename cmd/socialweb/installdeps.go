package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/hostcheck"
)

func newInstallDepsCommand() *cobra.Command {
	c := hostcheck.Config{}
	var optional, dryRun bool
	cmd := &cobra.Command{
		Use:   "install-deps",
		Short: "Install what check-host finds missing: Debian packages with apt-get, and the pinned Deno",
		Long: `Install what this host lacks for what up would run with the same flags (check-host's
MISSING rows): the Debian packages that provide them, with apt-get (needs root), and the
pinned Deno into the user's cache (from npm's cache, else the npm registry, checked against
the pinned integrity). Rows only the operator can satisfy (MUST BE PASSED IN, a kernel
feature) are printed, not acted on. Then the host is checked again; the exit is non-zero when
something needed still does not hold.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := c.Validate(); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			say := func(format string, a ...any) { fmt.Fprintf(out, "== "+format+"\n", a...) }
			pkgs := hostcheck.Packages(hostcheck.Check(hostcheck.Probe(c), c), optional)
			switch {
			case len(pkgs) == 0:
				say("no Debian package missing")
			case dryRun:
				say("would run: apt-get update && %s", hostcheck.Install(strings.Join(pkgs, " ")))
			default:
				if err := aptInstall(cmd, pkgs); err != nil {
					return err
				}
			}
			if c.Deno {
				if dryRun {
					say("would fetch the pinned deno unless one is found (socialweb check-host says where)")
				} else if p, err := app.EnsureDeno(cmd.Context(), say); err != nil {
					say("deno: %v", err)
				} else {
					say("deno: %s", p)
				}
			}
			h := hostcheck.Probe(c)
			rows := hostcheck.Check(h, c)
			for _, l := range hostcheck.Summary(rows, c) {
				fmt.Fprintln(out, l)
			}
			if dryRun {
				return nil
			}
			return hostcheck.Err(rows)
		},
	}
	addHostConfigFlags(cmd, &c)
	cmd.Flags().BoolVar(&optional, "optional", false, "also install what the configuration runs without (KVM tools, image build tools, the host's containerd when nodes use the node runtime)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be installed and change nothing")
	return cmd
}

// aptInstall installs pkgs with apt-get as root.
func aptInstall(cmd *cobra.Command, pkgs []string) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("installing %s needs root: sudo %s (or: sudo socialweb install-deps)", strings.Join(pkgs, " "), hostcheck.Install(strings.Join(pkgs, " ")))
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("no apt-get: this host is not Debian-like; install the packages providing %s with its package manager", strings.Join(pkgs, ", "))
	}
	for _, args := range [][]string{{"update", "-qq"}, append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)} {
		fmt.Fprintf(cmd.OutOrStdout(), "== apt-get %s\n", strings.Join(args, " "))
		c := exec.CommandContext(cmd.Context(), "apt-get", args...)
		c.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		c.Stdout, c.Stderr = cmd.OutOrStdout(), cmd.ErrOrStderr()
		if err := c.Run(); err != nil {
			return fmt.Errorf("apt-get %s: %w", args[0], err)
		}
	}
	return nil
}
