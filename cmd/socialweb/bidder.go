package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/node"
)

func newBidderCommand() *cobra.Command {
	var follow []string
	var pdsURL, identifier, passwordFile, stateDir, level, currency, plcURL, listen, kind, tlsCert, tlsKey, publicURL string
	var nodes node.Config
	var cost, costPerCPU, costPerGiB int64
	var free bool
	var capacity, maxGuestCPUs, maxGuestMemMiB int
	cmd := &cobra.Command{
		Use:   "bidder",
		Short: "Bid on compute rfps from an account on any PDS and run won guests on Deno or as tenant nodes",
		Long: "Bid on the market from an account on any PDS: write an offering, bid on rfps the\n" +
			"policy and capacity allow, run accepted guests and report them in events.\n" +
			"--substrate deno runs computeKind deno guests; --substrate node runs computeKind node\n" +
			"guests as Kubernetes nodes of tenant clusters on this host (root; images from --image-dir).\n" +
			"Guests and their state live in --state-dir; a restarted bidder finds them again.\n" +
			"The password is read from --password-file or $SOCIALWEB_BIDDER_PASSWORD.\n" +
			"Requesters hand a won contract's secrets to --listen (published as the offering's\n" +
			"endpointUrl) with atproto service auth; their DIDs resolve through --plc-url. They send\n" +
			"them over plain http to a loopback address only: a bidder other hosts reach serves https\n" +
			"(--tls-cert, --tls-key) or publishes the https URL of a proxy in front of it (--public-url).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			if pdsURL == "" || identifier == "" {
				return errors.New("--pds and --identifier are required")
			}
			if !free {
				if err := app.CheckPrice("", app.LocalPrice{Cost: cost, PerCPU: costPerCPU, PerGiB: costPerGiB, Currency: currency}); err != nil {
					return err
				}
			}
			pw := os.Getenv("SOCIALWEB_BIDDER_PASSWORD")
			if passwordFile != "" {
				b, err := os.ReadFile(passwordFile)
				if err != nil {
					return err
				}
				pw = strings.TrimSpace(string(b))
			}
			if pw == "" {
				return errors.New("no password: give --password-file or set SOCIALWEB_BIDDER_PASSWORD")
			}
			// Before anything in it is touched: `up`'s bidder may hold the same dir.
			lock, err := bidder.LockStateDir(stateDir)
			if err != nil {
				return err
			}
			defer lock.Release()
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
			sub, err := newSubstrate(kind, filepath.Join(stateDir, "guests"), nodes)
			if err != nil {
				return err
			}
			if n, ok := sub.(*node.Substrate); ok {
				flavour, why := n.Flavour()
				log.Info("node flavour", "flavour", flavour, "why", why)
			}
			repo, err := repos.Login(cmd.Context(), pdsURL, identifier, pw)
			if err != nil {
				return fmt.Errorf("login to %s as %s: %w", pdsURL, identifier, err)
			}
			if plcURL == "" {
				return errors.New("--plc-url is empty: the secrets endpoint resolves requesters' DIDs through it")
			}
			dir := &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true}
			b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Remote(pdsURL), Substrate: sub,
				Cost: cost, CostPerCPU: costPerCPU, CostPerGiB: costPerGiB, Currency: currency, Free: free, Capacity: capacity, Log: log,
				MaxGuestCPUs: maxGuestCPUs, MaxGuestMemMiB: maxGuestMemMiB,
				Directory: dir, Listen: listen, TLSCertFile: tlsCert, TLSKeyFile: tlsKey, PublicURL: publicURL, StateDir: stateDir, Sources: feed.Sources(follow, nil, dir)})
			fmt.Fprintf(cmd.OutOrStdout(), "bidder %s (%s) on %s, guests in %s\n", repo.Handle(), repo.DID(), pdsURL, filepath.Join(stateDir, "guests"))
			err = b.Run(cmd.Context())
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&pdsURL, "pds", "", "URL of the PDS hosting the bidder's account")
	f.StringVar(&identifier, "identifier", "", "handle or DID of the bidder's account")
	f.StringVar(&passwordFile, "password-file", "", "file holding the account's (app) password")
	f.StringVar(&stateDir, "state-dir", filepath.Join(app.DefaultDataDir(), "bidder"), "where guests and their state live")
	f.Int64Var(&cost, "cost", 0, "price per hour of each guest, in --currency's smallest unit (cents for USD)")
	f.Int64Var(&costPerCPU, "cost-per-cpu", 0, "price per hour per CPU, in --currency's smallest unit, added to --cost")
	f.Int64Var(&costPerGiB, "cost-per-gib", 0, "price per hour per GiB of memory, in --currency's smallest unit, added to --cost (a part of a GiB costs its part, rounded up)")
	f.StringVar(&currency, "currency", "USD", "currency of --cost, --cost-per-cpu and --cost-per-gib")
	f.BoolVar(&free, "free", false, "bid free (bids.free) instead of a price")
	f.IntVar(&capacity, "capacity", 8, "guests run at once")
	f.IntVar(&maxGuestCPUs, "max-guest-cpus", 0, "largest guest bid on, in CPUs (0: this host's CPUs)")
	f.IntVar(&maxGuestMemMiB, "max-guest-mem-mib", 0, "largest guest bid on, in MiB of memory (0: this host's memory)")
	f.StringVar(&level, "log-level", "info", "log level on stderr: debug, info, warn, error")
	f.StringVar(&plcURL, "plc-url", "https://plc.directory", "did:plc directory that resolves requesters' DIDs")
	f.StringVar(&listen, "listen", "127.0.0.1:0", "address of the secrets endpoint (deliverSecrets)")
	f.StringVar(&tlsCert, "tls-cert", "", "PEM certificate (chain) the secrets endpoint serves https with, read again when it changes; with --tls-key")
	f.StringVar(&tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&publicURL, "public-url", "", "URL requesters reach the secrets endpoint at, published as the offering's endpointUrl: https://host[:port] of a proxy in front of --listen (default: --listen's address, https with --tls-cert)")
	f.StringVar(&kind, "substrate", deno.Kind, "what runs won guests: deno, or node (tenant-cluster nodes)")
	f.StringArrayVar(&follow, "follow", nil, "firehose of another PDS (or relay) URL to follow for rfps, repeatable: requesters there")
	f.StringVar(&nodes.ImageDir, "image-dir", "", "with --substrate node: OCI image tarballs (*.tar) imported into every node")
	f.StringVar(&nodes.RuntimeDir, "node-runtime", "", "with --substrate node: a directory holding containerd, containerd-shim-runc-v2, runc and ctr (hack/build-node-runtime.sh); default node-runtime beside this binary when present, else the host's on PATH; \"host\": the host's")
	f.StringVar(&nodes.RegistryConfigDir, "registry-config", "", "with --substrate node: how nodes reach image registries, a directory in containerd's hosts layout (HOST[:PORT]/hosts.toml with mirrors, CA files and credential headers; see docs/images.md)")
	f.StringVar(&nodes.Flavour, "node-flavour", node.FlavourAuto, "with --substrate node: namespace (containerd and the kubelet in a network namespace of this host), vm (inside a qemu microVM booted from --vm-image), or auto (vm when that image is there and kvm works, else namespace)")
	f.StringVar(&nodes.DNSUpstream, "node-dns-upstream", "", "with --substrate node: where nodes' DNS servers forward names outside their cluster: IP[:port],... or none (default: the first nameserver of this host's /etc/resolv.conf that is not loopback)")
	f.StringVar(&nodes.VMImageDir, "vm-image", filepath.Join(app.DefaultDataDir(), "images", "vm"), "with --node-flavour vm: the image `socialweb image build` wrote")
	addEgressFlags(f, &nodes.EgressAllow, &nodes.EgressDeny)
	addOverlayFlags(f, &nodes.OverlayAddress, &nodes.OverlayPorts)
	addNodeDiskFlag(f, &nodes.DiskMiB)
	return cmd
}

// addEgressFlags are the node egress policy's flags, for bidder and up alike.
func addEgressFlags(f *pflag.FlagSet, allow, deny *[]string) {
	f.StringSliceVar(deny, "node-egress-deny", nil, "with nodes: CIDRs (or addresses) pods may not reach, besides the defaults (private, shared, link-local, loopback, multicast and reserved ranges), repeatable or comma-separated")
	f.StringSliceVar(allow, "node-egress-allow", nil, "with nodes: CIDRs (or addresses) pods may reach although the deny list holds them (a registry or DNS server on this provider's private network); never this host, its node links, or the pod, service and link-local ranges")
}

// addOverlayFlags are the flags of the nodes' published overlay endpoints, for bidder and up
// alike.
func addOverlayFlags(f *pflag.FlagSet, address, ports *string) {
	f.StringVar(address, "node-overlay-address", "", "with nodes: this host's public IPv4 address as other hosts reach it; each node then publishes an overlay endpoint of it (a UDP port of --node-overlay-ports forwarded to the node), so nodes of a cluster rented on other hosts are its peers (default: none, a node is a peer of this host's nodes only)")
	f.StringVar(ports, "node-overlay-ports", "", "with --node-overlay-address: the UDP ports forwarded to nodes, FIRST-LAST (default "+podnet.DefaultOverlayPorts.String()+"); open them in the host's firewall")
}

// addNodeDiskFlag is the flag of a node's disk when its contract names none, for bidder and
// up alike.
func addNodeDiskFlag(f *pflag.FlagSet, mib *int) {
	f.IntVar(mib, "node-disk-mib", node.DefaultDiskMiB, "with nodes: the disk (MiB) of a namespace node whose contract names none: its images, emptyDirs, volumes and logs live on a file system of that size, and the kubelet reports it as the node's ephemeral-storage")
}

// UnknownSubstrateError is a --substrate the bidder command cannot run.
type UnknownSubstrateError struct{ Kind string }

func (e *UnknownSubstrateError) Error() string {
	return fmt.Sprintf("--substrate %q: want %s or %s", e.Kind, deno.Kind, node.Kind)
}

// newSubstrate is the substrate of --substrate, its guests under stateDir.
func newSubstrate(kind, stateDir string, nodes node.Config) (substrate.Substrate, error) {
	switch kind {
	case deno.Kind:
		if nodes.ImageDir != "" || nodes.RegistryConfigDir != "" {
			return nil, errors.New("--image-dir and --registry-config are for --substrate node")
		}
		return deno.New(deno.Config{StateDir: stateDir})
	case node.Kind:
		nodes.StateDir = stateDir
		s, err := node.New(nodes)
		if err != nil {
			return nil, err
		}
		// Before the bidder adopts its guests: nodes that died with an earlier run leave
		// no host state (docs/nodes.md).
		s.SweepDead(context.Background(), func(line string) { fmt.Fprintln(os.Stderr, "bidder:", line) })
		return s, nil
	}
	return nil, &UnknownSubstrateError{Kind: kind}
}
