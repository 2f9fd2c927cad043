package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"socialweb.computer/config/crd"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/diskspace"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/hostcheck"
	"socialweb.computer/internal/logsink"
	"socialweb.computer/internal/procmem"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/tenant"
)

// UpOptions configure `socialweb up`.
type UpOptions struct {
	DataDir     string
	Listen      string
	MetricsAddr string
	// PprofAddr serves Go's runtime profiles on a loopback address (PprofOff or "": none).
	PprofAddr string
	PDSListen string
	// PDSOpenSignup lets anyone reaching the PDS create an account without an invite code;
	// refused unless PDSListen is a loopback address.
	PDSOpenSignup bool
	// PDSAdminPassword opens the PDS's createInviteCode(s) to HTTP Basic admin:<it>.
	PDSAdminPassword string
	// PDSPublicURL is where the world reaches the PDS (PDSOptions.PublicURL); PDSRelays are
	// asked to crawl it.
	PDSPublicURL string
	PDSRelays    []string
	// PLCURL is an external did:plc directory the embedded PDS registers its accounts with
	// (PDSOptions.PLCURL): what bidders and requesters on other hosts resolve them through.
	// Empty runs one in-process, which only this host reaches.
	PLCURL string
	// GatewayListen is the address of the cluster gateway (XRPC).
	GatewayListen string
	// GatewayAllow are accounts (DIDs) the gateway serves besides the local account;
	// GatewayOpen serves every account whose DID resolves.
	GatewayAllow []string
	GatewayOpen  bool
	// Quota is what one account may hold: clusters (the gateway), nodes and node-hours
	// (the node host).
	Quota quota.Limits
	// TenantAdvertise is the tenant apiservers' advertise address; "" creates a network
	// namespace and veth pair for it (tenant.EnsureAdvertiseAddress).
	TenantAdvertise string
	// TenantPublicAddress is this host's public IPv4 address where nodes on other hosts
	// join its tenant clusters (tenant.Config.PublicAddress; the local node bidder takes it
	// as its own gate, node.Config.LocalGateAddress); "" keeps the gates on loopback.
	TenantPublicAddress string
	// NodeBidWindow is the bid window of the node contracts the NodeClaim controller
	// declares (0: the market's default, 30 s).
	NodeBidWindow time.Duration
	// NodePrice prices the local node bidder's bids by the size each rfp asks (zero: free
	// bids). The local deno bidder bids free.
	NodePrice LocalPrice
	// NodeFlavour is how the local node bidder runs nodes (node.FlavourNamespace, the
	// default, or node.FlavourVM with the image in NodeVMImage).
	NodeFlavour, NodeVMImage string
	// NodeEgressAllow and NodeEgressDeny change what the local node bidder's pods may
	// reach beyond their cluster (node.Config.EgressAllow, EgressDeny).
	NodeEgressAllow, NodeEgressDeny []string
	// NodeOverlayAddress and NodeOverlayPorts publish the local nodes' overlay endpoints on
	// this host's public address (node.Config.OverlayAddress, OverlayPorts).
	NodeOverlayAddress, NodeOverlayPorts string
	// NodeDiskMiB is the disk of a local node whose contract names none (node.Config.DiskMiB).
	NodeDiskMiB int
	// NodeDNSUpstream is where the local node bidder's nodes forward names outside their
	// cluster (node.Config.DNSUpstream).
	NodeDNSUpstream string
	// NodeRegistryConfig is the local node bidder's registry configuration
	// (node.Config.RegistryConfigDir); "" means DATA_DIR/node-bidder/registries.
	NodeRegistryConfig string
	// NodeRuntimeDir is the local node bidder's node runtime (node.Config.RuntimeDir);
	// "" means node-runtime beside the binary, else the host's.
	NodeRuntimeDir string
	// PodSecurity is the Pod Security level every tenant cluster enforces at least
	// (tenant.PodSecurityBaseline, the default, or tenant.PodSecurityRestricted).
	PodSecurity string
	// PodUserNamespaces is required, optional or auto (""): whether every tenant cluster
	// runs every pod in a user namespace (tenant.ChoosePodUserNamespaces).
	PodUserNamespaces string
	LogLevel          slog.Level
	// MarketFollow are firehoses (PDS or relay URLs) the market follows besides the embedded
	// PDS: the requester for bidders elsewhere, the local bidders for requesters elsewhere.
	MarketFollow []string
	// ConsoleListen is the address of the live console (ConsoleOff: none).
	ConsoleListen string
	// Out receives the ready line; Progress receives phase lines.
	Out, Progress io.Writer
}

// DefaultNodeBidWindow is up's bid window for node contracts: up's own node bidder bids in
// well under a second (docs/market.md: p99 767 ms from Requested to Held), and the window
// closes at once when every known bidder has bid; the market's 30 s default would be most of a
// scale-up (docs/nodes.md).
const DefaultNodeBidWindow = 2 * time.Second

// memWatchInterval is how often up samples its heap for a spike to hand back.
const memWatchInterval = 5 * time.Second

// UpStateNamespace is where `up`'s controllers keep their own state.
const UpStateNamespace = "socialweb-system"

// DefaultDataDir is $XDG_STATE_HOME/socialweb, else ~/.local/state/socialweb: state, not
// configuration and not the working directory.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "socialweb")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "socialweb")
	}
	return filepath.Join(os.TempDir(), "socialweb")
}

// Up runs the embedded stack until ctx ends, then stops it in order: controllers, API
// server, etcd.
func Up(ctx context.Context, o UpOptions) error {
	if o.NodeBidWindow < 0 {
		return fmt.Errorf("node bid window %s: want 0 (the market's default) or a positive duration", o.NodeBidWindow)
	}
	if err := CheckPrice("node-", o.NodePrice); err != nil {
		return err
	}
	if _, err := tenantPublicAddress(o.TenantPublicAddress); err != nil {
		return err
	}
	t0 := time.Now()
	restoreGC := procmem.RelaxGCForStart()
	defer restoreGC()
	phase := func(format string, a ...any) {
		fmt.Fprintf(o.Progress, "%6.2fs  %s\n", time.Since(t0).Seconds(), fmt.Sprintf(format, a...))
	}
	crds, err := crd.CRDs()
	if err != nil {
		return err
	}
	dir, err := core.OpenDataDir(o.DataDir)
	if err != nil {
		return err
	}
	logFile, log, err := openLog(filepath.Join(dir.Logs(), "socialweb.log"), o.LogLevel)
	if err != nil {
		dir.Close()
		return err
	}
	defer logFile.Close()
	if o.PprofAddr != PprofOff && o.PprofAddr != "" {
		at, err := startPprof(ctx, o.PprofAddr, log)
		if err != nil {
			dir.Close()
			return err
		}
		phase("pprof serving at http://%s/debug/pprof/", at)
	}

	// Deno guests need the pinned Deno; up fetches it itself when no binary is there yet.
	if _, err := EnsureDeno(ctx, phase); err != nil {
		phase("deno not provisioned: %v", err)
	}

	// What this host can run, one line per substrate (`socialweb check-host` says it row by
	// row); the stack starts whatever it says, each substrate saying below whether it runs.
	hc := o.hostCheckConfig()
	for _, l := range hostcheck.Summary(hostcheck.Check(hostcheck.Probe(hc), hc), hc) {
		phase("host: %s", l)
	}
	phase("starting core in %s (etcd, API server, %d CRDs)", dir.Root, len(crds))
	c, err := core.Start(ctx, core.Config{Dir: dir, Listen: o.Listen, CRDs: crds, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		phase("stopping API server and etcd")
		c.Stop()
		phase("stopped")
	}()
	phase("core serving at %s", c.URL)
	go watchRoom(ctx, dir.Root, c, log, phase)

	srv, err := StartPDS(ctx, PDSOptions{DataDir: filepath.Join(dir.Root, "pds"), Addr: o.PDSListen, Logger: log,
		OpenSignup: o.PDSOpenSignup, AdminPassword: o.PDSAdminPassword, PublicURL: o.PDSPublicURL, Relays: o.PDSRelays, PLCURL: o.PLCURL})
	if err != nil {
		return err
	}
	defer func() {
		phase("stopping PDS")
		srv.Close()
	}()
	acct, err := EnsureLocalAccount(ctx, srv, filepath.Join(dir.Root, "pds"), DefaultHandle)
	if err != nil {
		return err
	}
	phase("PDS serving at %s (PLC %s), local account %s %s", ServingAt(srv), srv.PLCURL(), acct.Handle, acct.DID)
	showPassword(phase, acct)
	if o.PDSOpenSignup {
		phase("PDS sign-up is open to anyone reaching %s (no invite code)", srv.URL())
	}

	// The local node bidder's substrate first: whether its nodes run pods in user namespaces
	// decides the tenant clusters' default (--pod-user-namespaces auto).
	nodeSub, err := newLocalNodeSubstrate(dir.Root, node.Config{Flavour: o.NodeFlavour, VMImageDir: o.NodeVMImage, RegistryConfigDir: o.NodeRegistryConfig, RuntimeDir: o.NodeRuntimeDir, DNSUpstream: o.NodeDNSUpstream,
		EgressAllow: o.NodeEgressAllow, EgressDeny: o.NodeEgressDeny, OverlayAddress: o.NodeOverlayAddress, OverlayPorts: o.NodeOverlayPorts, DiskMiB: o.NodeDiskMiB,
		LocalGateAddress: o.TenantPublicAddress}, phase)
	if err != nil {
		return err
	}
	runThem, whyNot := localNodesRunUserNamespaces(nodeSub)
	userns, usernsWhy, err := tenant.ChoosePodUserNamespaces(o.PodUserNamespaces, runThem, whyNot)
	if err != nil {
		return err
	}
	policy := tenant.PodPolicy{Level: tenant.PodSecurityLevel(o.PodSecurity), UserNamespaces: userns}
	tenants, why := startTenants(dir.Root, o.TenantAdvertise, o.TenantPublicAddress, policy, log)
	if tenants != nil {
		defer func() {
			phase("stopping tenant control planes")
			tenants.Shutdown()
		}()
		phase("tenant clusters served here (data in %s); every pod: Pod Security %s at least, user namespaces %s (%s)",
			filepath.Join(dir.Root, "tenants"), policy.Level, policy.UserNamespaces, usernsWhy)
		if o.TenantPublicAddress != "" {
			phase("nodes on other hosts join at %s (each cluster's gate listens there on its own port)", o.TenantPublicAddress)
		}
	} else {
		phase("tenant clusters unavailable: %s", why)
	}

	// Not a child of ctx: the controllers stop when told to, first, and a signal does not
	// race them to an early exit that the stop sequence below would then wait for in vain.
	ctrlCtx, stopControllers := context.WithCancel(context.WithoutCancel(ctx))
	// The local bidders run on ctrlCtx too. Deferred calls run last first: ctrlCtx is
	// cancelled, then the bidders are waited for, and only then does the PDS they write to
	// (a released guest's final event) close.
	var bidders sync.WaitGroup
	defer waitStopped(&bidders, 30*time.Second, func() { phase("bidders did not stop within 30s; stopping the PDS anyway") })
	defer stopControllers()
	if tenants != nil {
		if err := ensureNodeRequester(ctx, c.RESTConfig); err != nil {
			return err
		}
	}
	m, err := NewControllers(c.RESTConfig, ControllerOptions{MetricsAddr: o.MetricsAddr, Logger: log, PDS: srv, Tenants: tenants, TenantsUnavailable: why,
		NodeBidWindow: o.NodeBidWindow, Quota: o.Quota,
		// Outside any workspace, so that deleting one (every Secret in it) leaves the
		// requester's index alone; the core serves no Namespaces, any name holds objects.
		StateNamespace: UpStateNamespace,
		// The local bidders live on srv, whatever PDS a requester's repo is on.
		MarketSources: append([]string{srv.URL()}, o.MarketFollow...)})
	if err != nil {
		return err
	}
	// The controllers start before the gateway, the console and the bidders, which need
	// none of them: their caches sync (a list and a watch of each kind, and client-go's
	// 100 ms polls of the sync) while those start, which after a crash is time taken off
	// the recovery of every deployment the crash interrupted.
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- m.Start(ctrlCtx) }()
	running := false
	defer func() {
		if !running { // a later step failed: the controllers stop before what they use does
			stopControllers()
			select {
			case <-ctrlDone:
			case <-time.After(30 * time.Second):
			}
		}
	}()

	access := gateway.Access{Allow: append([]string{acct.DID}, o.GatewayAllow...), Open: o.GatewayOpen}
	gw, err := StartGateway(GatewayOptions{Core: c.RESTConfig, PLCURL: srv.PLCURL(), TenantsRoot: filepath.Join(dir.Root, "tenants"),
		Addr: o.GatewayListen, Access: access, Quota: o.Quota, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		phase("stopping gateway")
		gw.Close()
	}()
	phase("gateway serving at %s (service DID %s)", gw.URL(), gw.DID())
	phase("%s", AccessLine(access))
	con, err := startConsole(ctx, o.ConsoleListen, c, dir.Root, srv.URL(), tenants, log)
	if err != nil {
		return err
	}
	consoleAt := ""
	if con != nil {
		defer con.Close()
		consoleAt = ", console " + con.URL()
		phase("console serving at %s (log in with the kubeconfig's token, %s)", con.URL(), dir.AdminToken())
	}

	if err := startLocalBidder(ctrlCtx, &bidders, srv, dir.Root, o.MarketFollow, log, phase); err != nil {
		return err
	}
	if tenants != nil && nodeSub != nil {
		if err := startLocalNodeBidder(ctrlCtx, &bidders, srv, dir.Root, nodeSub, o.NodePrice, o.MarketFollow, log, phase); err != nil {
			return err
		}
	}
	if !m.GetCache().WaitForCacheSync(ctx) {
		return errors.New("controllers: caches did not sync")
	}
	running = true
	phase("controllers started")
	fmt.Fprintf(o.Out, "socialweb is ready in %.2fs: kubeconfig %s (export KUBECONFIG=%s)%s\n", time.Since(t0).Seconds(), c.KubeconfigPath, c.KubeconfigPath, consoleAt)
	// Start-up builds OpenAPI documents, decodes every CRD once and runs the initialisers of
	// every component linked into the binary: hand that heap and those pages back now rather
	// than letting the idle process hold them (what it touches again faults back in).
	restoreGC()
	procmem.Settle()
	// And again after each burst of requests: the heap a burst grew to (bad input to the API
	// server or the PDS costs tens of MiB a request) goes back once the burst is over.
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go procmem.Watch(watchCtx, memWatchInterval, func(before, after procmem.Heap) {
		log.Info("handed back the heap of a burst", "heapBeforeMiB", before.Retained>>20, "heapAfterMiB", after.Retained>>20)
	})

	var runErr error
	ctrlStopped := false
	select {
	case <-ctx.Done():
	case err := <-ctrlDone:
		ctrlStopped = true
		runErr = errors.New("controllers stopped")
		if err != nil {
			runErr = fmt.Errorf("controllers stopped: %w", err)
		}
	case err := <-c.Done():
		runErr = fmt.Errorf("API server stopped: %w", err)
	}
	phase("stopping controllers and bidders")
	stopControllers()
	if !ctrlStopped {
		select {
		case <-ctrlDone:
		case <-time.After(30 * time.Second):
			phase("controllers did not stop within 30s; stopping the core anyway")
		}
	}
	return runErr
}

// waitStopped waits for wg, or for timeout, after which it calls late and returns.
func waitStopped(wg *sync.WaitGroup, timeout time.Duration, late func()) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		late()
	}
}

// hostCheckConfig is what up runs, as the host check sees it: the deno bidder, tenant
// clusters and their node bidder with up's node flags.
func (o UpOptions) hostCheckConfig() hostcheck.Config {
	return hostcheck.Config{Deno: true, Tenants: true, NodeFlavour: o.NodeFlavour, VMImage: o.NodeVMImage,
		NodeRuntime: o.NodeRuntimeDir, RegistryConfig: o.NodeRegistryConfig, TenantAdvertise: o.TenantAdvertise,
		EgressAllow: o.NodeEgressAllow}
}

// showPassword prints a local account's password the one time it exists outside the PDS:
// when the account was made, or when a password an older version kept in clear was replaced.
// The controllers act as the account in-process and never need it; a person logging in
// from a client does.
func showPassword(phase func(string, ...any), a *LocalAccount) {
	switch {
	case a.Migrated:
		phase("password of %s: %s (replaced: account.json held the old one in clear; shown once, the data dir keeps no copy)", a.Handle, a.Password)
	case a.Password != "":
		phase("password of %s: %s (shown once: the data dir keeps no copy)", a.Handle, a.Password)
	}
}

// openLog sends slog and klog (the API server's logger) to path, so the terminal shows
// phases and errors rather than the API server's chatter.
func openLog(path string, level slog.Level) (*os.File, *slog.Logger, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, nil, err
	}
	logsink.KlogTo(f)
	log := slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: level}))
	return f, log, nil
}

// Room the data dir and the store are watched for: below DataDirWarnBelow free, or past
// StoreWarnAt of the store's quota, up says so once (and once more when it is over), before
// a write fails.
const (
	DataDirWarnBelow = 512 * diskspace.MiB
	StoreWarnAt      = 0.8
	roomInterval     = 30 * time.Second
)

// watchRoom warns on the progress output and in the log while the data dir's file system
// or the store's quota runs out.
func watchRoom(ctx context.Context, root string, c *core.Core, log *slog.Logger, phase func(string, ...any)) {
	go diskspace.Watch(ctx, root, DataDirWarnBelow, roomInterval, func(r diskspace.Room, l diskspace.Level, err error) {
		switch {
		case err != nil:
			log.Warn("data_dir_room_unknown", "dir", root, "error", err.Error())
		case l == diskspace.Low:
			phase("warning: %s has %s free, under %s: the store stops when its file system is full; free some space there",
				root, diskspace.Human(r.Free), diskspace.Human(DataDirWarnBelow))
			log.Warn("data_dir_low", "dir", root, "free_bytes", r.Free)
		default:
			log.Info("data_dir_room", "dir", root, "free_bytes", r.Free)
		}
	})
	warned := false
	t := time.NewTicker(roomInterval)
	defer t.Stop()
	for {
		size, quota := c.StoreUse()
		switch high := float64(size) >= StoreWarnAt*float64(quota); {
		case high && !warned:
			phase("warning: the store holds %s of its %s quota; past it every write is refused: delete objects you do not need",
				diskspace.Human(uint64(size)), diskspace.Human(uint64(quota)))
			log.Warn("store_quota_high", "size_bytes", size, "quota_bytes", quota)
			warned = true
		case !high && warned:
			log.Info("store_quota_ok", "size_bytes", size, "quota_bytes", quota)
			warned = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
