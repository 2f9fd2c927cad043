package app

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"

	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/deno"
)

// LocalBidderHandle is the account of the bidder `up` runs on the embedded PDS.
const LocalBidderHandle = "bidder.test"

// startLocalBidder runs the local default bidder (deno guests, free bids) until ctx ends:
// its own account on srv (password in DATA_DIR/bidder/account.json) and its guests' state
// in DATA_DIR/bidder/guests. Without a Deno binary it says so and runs none.
func startLocalBidder(ctx context.Context, srv *pds.Server, root string, log *slog.Logger, phase func(string, ...any)) error {
	dir := filepath.Join(root, "bidder")
	sub, err := deno.New(deno.Config{StateDir: filepath.Join(dir, "guests")})
	if errors.Is(err, substrate.ErrUnavailable) {
		phase("local bidder not started: %v", err)
		return nil
	}
	if err != nil {
		return err
	}
	acct, err := EnsureLocalAccount(ctx, srv, dir, LocalBidderHandle)
	if err != nil {
		return err
	}
	repo, err := repos.Local(ctx, srv, acct.DID)
	if err != nil {
		return err
	}
	b := bidder.New(bidder.Config{Repo: repo, Fetch: feed.Local(srv), Substrate: sub, Free: true,
		Directory: srv.Directory(), Log: log})
	go func() {
		if err := b.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("local bidder stopped", "err", err)
		}
	}()
	phase("local bidder %s %s (deno guests)", acct.Handle, acct.DID)
	return nil
}
