package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/node"
)

// LocalBidderHandle is the account of the bidder `up` runs on the embedded PDS.
const LocalBidderHandle = "bidder.test"

// LocalNodeBidderHandle is the account of the bidder `up` runs for tenant nodes.
const LocalNodeBidderHandle = "nodebidder.test"

// The local bidders' directories under up's data dir: each holds its account, and its
// guests' state in guests/.
func localBidderDir(root string) string     { return filepath.Join(root, "bidder") }
func localNodeBidderDir(root string) string { return filepath.Join(root, "node-bidder") }
func guestsDir(bidderDir string) string     { return filepath.Join(bidderDir, "guests") }

// LocalNodeStateDir is the state dir of the nodes of up's local node bidder in the data dir
// root.
func LocalNodeStateDir(root string) string { return guestsDir(localNodeBidderDir(root)) }

// startLocalBidder runs the local default bidder (deno guests, free bids) until ctx ends:
// its own account on srv (handle and DID in DATA_DIR/bidder/account.json; it acts in-process
// and keeps no password) and its guests' state in DATA_DIR/bidder/guests. Without a Deno
// binary, or what its jail needs (root, unshare, cgroups), it says so and runs none.
func startLocalBidder(ctx context.Context, running *sync.WaitGroup, srv *pds.Server, root string, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	dir := localBidderDir(root)
	sub, err := deno.New(deno.Config{StateDir: guestsDir(dir)})
	if errors.Is(err, substrate.ErrUnavailable) {
		phase("local bidder not started: %v", err)
		return nil
	}
	if err != nil {
		return err
	}
	return runLocalBidder(ctx, running, srv, dir, LocalBidderHandle, sub, LocalPrice{}, sources, log, phase)
}

// startLocalNodeBidder runs the bidder of tenant nodes (computeKind node, free bids unless
// up prices them) until ctx ends: a second account on srv (DATA_DIR/node-bidder/account.json)
// whose guests are nodes of the tenant clusters this process serves, kept in DATA_DIR/node-bidder/guests and
// given the image tarballs of DATA_DIR/node-bidder/images at boot and the registry
// configuration of DATA_DIR/node-bidder/registries (or nodes.RegistryConfigDir). A bidder serves one
// substrate, so nodes get their own account rather than a second substrate in the deno
// bidder. It runs only beside tenant control planes (a node joins a gate on this host) and
// when the node substrate's prerequisites hold (root, containerd, runc, the CNI plugins);
// otherwise it says why and runs none. newLocalNodeSubstrate makes the substrate (nil when
// this host cannot run nodes, having said why); startLocalNodeBidder runs the bidder.
func newLocalNodeSubstrate(root string, nodes node.Config, phase func(string, ...any)) (*node.Substrate, error) {
	dir := localNodeBidderDir(root)
	images := filepath.Join(dir, "images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		return nil, err
	}
	nodes.StateDir, nodes.ImageDir, nodes.Progress = guestsDir(dir), images, phase
	if nodes.RegistryConfigDir == "" {
		nodes.RegistryConfigDir = filepath.Join(dir, "registries")
		if err := os.MkdirAll(nodes.RegistryConfigDir, 0o700); err != nil {
			return nil, err
		}
	}
	sub, err := node.New(nodes)
	if errors.Is(err, substrate.ErrUnavailable) {
		phase("local node bidder not started: %v", err)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Before the bidder adopts its guests: nodes that died with an earlier up leave no
	// host state (docs/nodes.md).
	sub.SweepDead(context.Background(), func(line string) { phase("local node bidder: %s", line) })
	flavour, why := sub.Flavour()
	phase("local node bidder runs %s nodes: %s", flavour, why)
	if rtDir, rtWhy, _ := sub.Runtime(); flavour == node.FlavourNamespace {
		phase("local node bidder's node runtime: %s (%s)", or(rtDir, "the host's containerd and runc"), rtWhy)
	}
	return sub, nil
}

// startLocalNodeBidder runs the node bidder of sub (newLocalNodeSubstrate) from its own
// account, bidding at price.
func startLocalNodeBidder(ctx context.Context, running *sync.WaitGroup, srv *pds.Server, root string, sub *node.Substrate, price LocalPrice, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	return runLocalBidder(ctx, running, srv, localNodeBidderDir(root), LocalNodeBidderHandle, sub, price, sources, log, phase)
}

// LocalPrice prices a bidder's bids per hour by the size each rfp asks, in the smallest unit
// of Currency: Cost per guest, PerCPU per CPU, PerGiB per GiB of memory (bidder.Config Cost,
// CostPerCPU, CostPerGiB). The zero price bids free (bids.free).
type LocalPrice struct {
	Cost, PerCPU, PerGiB int64
	Currency             string
}

// Free says whether the price is no price at all: free bids.
func (p LocalPrice) Free() bool { return p.Cost == 0 && p.PerCPU == 0 && p.PerGiB == 0 }

// String is the price as the bidder's start line says it.
func (p LocalPrice) String() string {
	if p.Free() {
		return "free bids"
	}
	return fmt.Sprintf("bids of %d %s per hour per guest + %d per CPU + %d per GiB", p.Cost, or(p.Currency, "USD"), p.PerCPU, p.PerGiB)
}

// maxCurrencyBytes is the longest currency a priced bid's record holds
// (com.publicdomainrelay.temp.market.bids.priced).
const maxCurrencyBytes = 16

// CheckPrice says what is wrong with a price given by the flags --<prefix>cost,
// --<prefix>cost-per-cpu, --<prefix>cost-per-gib and --<prefix>currency, or nil: a part
// below zero, or a currency longer than a bid record holds, would make every bid fail.
func CheckPrice(prefix string, p LocalPrice) error {
	for _, part := range []struct {
		flag string
		v    int64
	}{{"cost", p.Cost}, {"cost-per-cpu", p.PerCPU}, {"cost-per-gib", p.PerGiB}} {
		if part.v < 0 {
			return fmt.Errorf("--%s%s %d: want 0 or more", prefix, part.flag, part.v)
		}
	}
	if len(p.Currency) > maxCurrencyBytes {
		return fmt.Errorf("--%scurrency %q: want at most %d bytes, e.g. USD", prefix, p.Currency, maxCurrencyBytes)
	}
	return nil
}

// apply sets the price in a bidder's configuration.
func (p LocalPrice) apply(c *bidder.Config) {
	if p.Free() {
		c.Free = true
		return
	}
	c.Cost, c.CostPerCPU, c.CostPerGiB, c.Currency = p.Cost, p.PerCPU, p.PerGiB, p.Currency
}

// localNodesRunUserNamespaces says whether sub's nodes run pods in user namespaces, or why
// not: what its offering states (the pod-user-namespaces layer), so that up requires them of
// its clusters exactly when its own node bidder meets the requirement.
func localNodesRunUserNamespaces(sub *node.Substrate) (bool, string) {
	if sub == nil {
		return false, "no local node bidder"
	}
	if slices.Contains(sub.Isolation().Layers, substrate.LayerPodUserNamespaces) {
		return true, ""
	}
	if flavour, _ := sub.Flavour(); flavour != node.FlavourNamespace {
		return false, flavour + " nodes: their guest kernel has no idmapped mounts on tmpfs"
	}
	return false, "the host's containerd and runc are too old for them; the node runtime (bash hack/build.sh) runs them"
}

// runLocalBidder runs a bidder of sub from account handle on srv until ctx ends, bidding at
// price (free when zero), following the firehoses of sources (requesters elsewhere) besides
// srv's. running counts it until it has stopped: its last writes (a released guest's final
// event) go to srv, which must stay open until then.
func runLocalBidder(ctx context.Context, running *sync.WaitGroup, srv *pds.Server, dir, handle string, sub substrate.Substrate, price LocalPrice, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	// A standalone `socialweb bidder` may hold the dir (and act as the same account).
	lock, err := bidder.LockStateDir(dir)
	if err != nil {
		return err
	}
	acct, err := EnsureLocalAccount(ctx, srv, dir, handle)
	if err != nil {
		lock.Release()
		return err
	}
	repo, err := repos.Local(ctx, srv, acct.DID)
	if err != nil {
		lock.Release()
		return err
	}
	cfg := bidder.Config{Repo: repo, Fetch: feed.Local(srv), Substrate: sub,
		Sources: feed.Sources(sources, srv, srv.Directory()), Directory: srv.Directory(), StateDir: dir, Log: log.With("bidder", handle)}
	price.apply(&cfg)
	b := bidder.New(cfg)
	running.Add(1)
	go func() {
		defer running.Done()
		defer lock.Release()
		if err := b.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("local bidder stopped", "bidder", handle, "err", err)
		}
	}()
	iso := sub.Isolation()
	phase("local bidder %s %s (%s guests; isolation %s: %s; %s)", acct.Handle, acct.DID, sub.Kind(), iso.Boundary, strings.Join(iso.Layers, ", "), price)
	return nil
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
