package main

import (
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/tenant"
)

func newUpCommand() *cobra.Command {
	var o app.UpOptions
	var level string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run the embedded stack: API server, etcd and controllers, on 127.0.0.1",
		Long: `Run the embedded stack in this process: an etcd member and a Kubernetes API server
serving the socialweb.computer kinds on 127.0.0.1 over TLS, and every controller.
The admin kubeconfig is written to DATA_DIR/kubeconfig. Stop with Ctrl-C (SIGINT) or SIGTERM;
objects are kept for the next up on the same data dir.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseLevel(level)
			if err != nil {
				return err
			}
			o.LogLevel = l
			if _, err := tenant.ParsePodSecurityLevel(o.PodSecurity); err != nil {
				return err
			}
			if _, _, err := tenant.ChoosePodUserNamespaces(o.PodUserNamespaces, false, ""); err != nil {
				return err
			}
			if err := app.CheckPublicFlags("pds-public-url", o.PDSPublicURL, "pds-relay", o.PDSRelays); err != nil {
				return err
			}
			o.Out, o.Progress = cmd.OutOrStdout(), cmd.ErrOrStderr()
			o.PDSAdminPassword = os.Getenv(app.AdminPasswordEnv)
			if o.NodeVMImage == "" {
				o.NodeVMImage = filepath.Join(o.DataDir, "images", "vm")
			}
			return app.Up(cmd.Context(), o)
		},
	}
	cmd.Flags().StringVar(&o.DataDir, "data-dir", app.DefaultDataDir(), "state directory (etcd, certificates, kubeconfig, logs)")
	cmd.Flags().StringVar(&o.Listen, "listen", "127.0.0.1:0", "HTTPS address of the API server (port 0 picks a free one)")
	cmd.Flags().StringVar(&o.PDSListen, "pds-listen", "127.0.0.1:0", "address of the embedded PDS (port 0 picks a free one)")
	cmd.Flags().BoolVar(&o.PDSOpenSignup, "pds-open-signup", false, "let anyone reaching the PDS create an account without an invite code (only with a loopback --pds-listen); otherwise accounts need an invite code from com.atproto.server.createInviteCode, as HTTP Basic admin with $"+app.AdminPasswordEnv)
	cmd.Flags().StringVar(&o.PDSPublicURL, "pds-public-url", "", "URL the world reaches the embedded PDS at, https://<host name> (a proxy in front of --pds-listen): DID documents and the service DID did:web:<host> name it; http only for localhost, *.localhost, *.test, *.example, *.invalid (default http://<pds listen address>)")
	cmd.Flags().StringVar(&o.PLCURL, "plc-url", "", "an external did:plc directory (https://plc.directory) the embedded PDS registers its accounts with, so bidders and requesters on other hosts resolve them; a data dir keeps the directory it started with (default: run one in-process, reached from this host only)")
	cmd.Flags().StringArrayVar(&o.PDSRelays, "pds-relay", nil, "a relay's base URL (https://relay.example.com) asked to crawl the embedded PDS (com.atproto.sync.requestCrawl) at start and after new accounts, repeatable; needs --pds-public-url")
	cmd.Flags().StringVar(&o.GatewayListen, "gateway-listen", "127.0.0.1:0", "address of the cluster gateway, XRPC (port 0 picks a free one)")
	cmd.Flags().StringArrayVar(&o.GatewayAllow, "gateway-allow", nil, "an account (DID) the cluster gateway serves besides up's local account, repeatable")
	cmd.Flags().BoolVar(&o.GatewayOpen, "gateway-open", false, "the cluster gateway serves every account whose DID resolves, not only the allowed ones")
	addQuotaFlags(cmd, &o.Quota, true)
	cmd.Flags().StringVar(&o.MetricsAddr, "metrics-addr", "0", "address for Prometheus metrics of the controllers, e.g. 127.0.0.1:9090 (0 turns it off)")
	cmd.Flags().StringVar(&o.PprofAddr, "pprof-addr", app.PprofOff, "loopback address serving Go's runtime profiles (net/http/pprof), e.g. 127.0.0.1:6060 (0 turns it off)")
	cmd.Flags().StringVar(&o.TenantPublicAddress, "tenant-address", "", "this host's public IPv4 address, where nodes rented on other hosts join its tenant clusters: each cluster's gate listens there too, on the port of its status.server (open those ports in the firewall), and node bundles name it (default: none, a cluster takes nodes of this host only)")
	cmd.Flags().StringVar(&o.TenantAdvertise, "tenant-advertise-address", "", "non-loopback address tenant apiservers advertise (default: 10.77.0.1 on a veth pair socialweb creates in network namespace socialweb-tenants; needs root and iproute2)")
	cmd.Flags().StringArrayVar(&o.MarketFollow, "market-follow", nil, "firehose of another PDS (or relay) URL the market follows, repeatable: bidders and requesters there")
	cmd.Flags().DurationVar(&o.NodeBidWindow, "node-bid-window", app.DefaultNodeBidWindow, "bid window of the node contracts a tenant cluster's scale-up declares; it closes early once every known bidder bid (0: the market's default, 30s)")
	cmd.Flags().Int64Var(&o.NodePrice.Cost, "node-cost", 0, "price per hour of each node the local node bidder bids on, in --node-currency's smallest unit (cents for USD); with --node-cost-per-cpu and --node-cost-per-gib all 0, it bids free")
	cmd.Flags().Int64Var(&o.NodePrice.PerCPU, "node-cost-per-cpu", 0, "price per hour per CPU of a node the local node bidder bids on, in --node-currency's smallest unit, added to --node-cost")
	cmd.Flags().Int64Var(&o.NodePrice.PerGiB, "node-cost-per-gib", 0, "price per hour per GiB of memory of a node the local node bidder bids on, in --node-currency's smallest unit, added to --node-cost (a part of a GiB costs its part, rounded up)")
	cmd.Flags().StringVar(&o.NodePrice.Currency, "node-currency", "USD", "currency of --node-cost, --node-cost-per-cpu and --node-cost-per-gib")
	cmd.Flags().StringVar(&o.NodeFlavour, "node-flavour", node.FlavourAuto, "how the local node bidder runs tenant nodes: namespace (containerd and the kubelet in a network namespace of the host), vm (inside a qemu microVM booted from --vm-image), or auto (vm when that image is there and kvm works, else namespace)")
	addEgressFlags(cmd.Flags(), &o.NodeEgressAllow, &o.NodeEgressDeny)
	addOverlayFlags(cmd.Flags(), &o.NodeOverlayAddress, &o.NodeOverlayPorts)
	addNodeDiskFlag(cmd.Flags(), &o.NodeDiskMiB)
	cmd.Flags().StringVar(&o.NodeDNSUpstream, "node-dns-upstream", "", "where the local node bidder's nodes forward names outside their cluster: IP[:port],... or none (default: the first nameserver of this host's /etc/resolv.conf that is not loopback)")
	cmd.Flags().StringVar(&o.NodeRuntimeDir, "node-runtime", "", "the local node bidder's node runtime: a directory holding containerd, containerd-shim-runc-v2, runc and ctr (hack/build-node-runtime.sh; they run pods with hostUsers: false); default node-runtime beside this binary when present, else the host's on PATH; \"host\": the host's")
	cmd.Flags().StringVar(&o.NodeRegistryConfig, "node-registry-config", "", "how the local node bidder's nodes reach image registries: a directory in containerd's hosts layout (HOST[:PORT]/hosts.toml with mirrors, CA files and credential headers; see docs/images.md); default DATA_DIR/node-bidder/registries")
	cmd.Flags().StringVar(&o.NodeVMImage, "vm-image", "", "with --node-flavour vm: the image `socialweb image build` wrote (default DATA_DIR/images/vm)")
	cmd.Flags().StringVar(&o.PodSecurity, "pod-security", string(tenant.PodSecurityBaseline), "Pod Security level every tenant cluster enforces on every pod: baseline or restricted (an owner may choose restricted for their cluster, never less than this)")
	cmd.Flags().StringVar(&o.PodUserNamespaces, "pod-user-namespaces", tenant.PodUserNamespacesAuto, "whether every tenant cluster runs every pod in a user namespace of its own (hostUsers: false defaulted, hostUsers: true refused; the cluster rents only nodes that run them): required, optional, or auto (required when the local node bidder's nodes run them); an owner may require them for their cluster, never drop the requirement")
	cmd.Flags().StringVar(&o.ConsoleListen, "console-listen", "127.0.0.1:0", "address of the live console, a web page of what up runs (a loopback address; port 0 picks a free one; off: none)")
	cmd.Flags().StringVar(&level, "log-level", "info", "level of DATA_DIR/logs/socialweb.log: debug, info, warn, error")
	return cmd
}
