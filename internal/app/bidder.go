package app

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

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

// startLocalBidder runs the local default bidder (deno guests, free bids) until ctx ends:
// its own account on srv (handle and DID in DATA_DIR/bidder/account.json; it acts in-process
// and keeps no password) and its guests' state in DATA_DIR/bidder/guests. Without a Deno
// binary, or what its jail needs (root, unshare, cgroups), it says so and runs none.
func startLocalBidder(ctx context.Context, srv *pds.Server, root string, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	dir := filepath.Join(root, "bidder")
	sub, err := deno.New(deno.Config{StateDir: filepath.Join(dir, "guests")})
	if errors.Is(err, substrate.ErrUnavailable) {
		phase("local bidder not started: %v", err)
		return nil
	}
	if err != nil {
		return err
	}
	return runLocalBidder(ctx, srv, dir, LocalBidderHandle, sub, sources, log, phase)
}

// startLocalNodeBidder runs the bidder of tenant nodes (computeKind node, free bids) until
// ctx ends: a second account on srv (DATA_DIR/node-bidder/account.json) whose guests are
// nodes of the tenant clusters this process serves, kept in DATA_DIR/node-bidder/guests and
// given the image tarballs of DATA_DIR/node-bidder/images at boot and the registry
// configuration of DATA_DIR/node-bidder/registries (or nodes.RegistryConfigDir). A bidder serves one
// substrate, so nodes get their own account rather than a second substrate in the deno
// bidder. It runs only beside tenant control planes (a node joins a gate on this host) and
// when the node substrate's prerequisites hold (root, containerd, runc, the CNI plugins);
// otherwise it says why and runs none. newLocalNodeSubstrate makes the substrate (nil when
// this host cannot run nodes, having said why); startLocalNodeBidder runs the bidder.
func newLocalNodeSubstrate(root string, nodes node.Config, phase func(string, ...any)) (*node.Substrate, error) {
	dir := filepath.Join(root, "node-bidder")
	images := filepath.Join(dir, "images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		return nil, err
	}
	nodes.StateDir, nodes.ImageDir, nodes.Progress = filepath.Join(dir, "guests"), images, phase
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
	flavour, why := sub.Flavour()
	phase("local node bidder runs %s nodes: %s", flavour, why)
	if rtDir, rtWhy, _ := sub.Runtime(); flavour == node.FlavourNamespace {
		phase("local node bidder's node runtime: %s (%s)", or(rtDir, "the host's containerd and runc"), rtWhy)
	}
	return sub, nil
}

// startLocalNodeBidder runs the node bidder of sub (newLocalNodeSubstrate) from its own
// account.
func startLocalNodeBidder(ctx context.Context, srv *pds.Server, root string, sub *node.Substrate, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	return runLocalBidder(ctx, srv, filepath.Join(root, "node-bidder"), LocalNodeBidderHandle, sub, sources, log, phase)
}

// localNodesRunUserNamespaces says whether sub's nodes run pods in user namespaces, or why
// not.
func localNodesRunUserNamespaces(sub *node.Substrate) (bool, string) {
	if sub == nil {
		return false, "no local node bidder"
	}
	if flavour, _ := sub.Flavour(); flavour != node.FlavourNamespace {
		return false, flavour + " nodes: their guest kernel has no idmapped mounts on tmpfs"
	}
	if _, _, userns := sub.Runtime(); !userns {
		return false, "the host's containerd and runc are too old for them; the node runtime (bash hack/build.sh) runs them"
	}
	return true, ""
}

// runLocalBidder runs a free-bidding bidder of sub from account handle on srv until ctx ends,
// following the firehoses of sources (requesters elsewhere) besides srv's.
func runLocalBidder(ctx context.Context, srv *pds.Server, dir, handle string, sub substrate.Substrate, sources []string, log *slog.Logger, phase func(string, ...any)) error {
	acct, err := EnsureLocalAccount(ctx, srv, dir, handle)
	if err != nil {
		return err
	}
	repo, err := repos.Local(ctx, srv, acct.DID)
	if err != nil {
		return err
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(srv), Substrate: sub, Free: true,
		Sources: feed.Sources(sources, srv, srv.Directory()), Directory: srv.Directory(), StateDir: dir, Log: log.With("bidder", handle)})
	go func() {
		if err := b.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("local bidder stopped", "bidder", handle, "err", err)
		}
	}()
	iso := sub.Isolation()
	phase("local bidder %s %s (%s guests; isolation %s: %s)", acct.Handle, acct.DID, sub.Kind(), iso.Boundary, strings.Join(iso.Layers, ", "))
	return nil
}

// or is s, or def when s is empty.
func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
