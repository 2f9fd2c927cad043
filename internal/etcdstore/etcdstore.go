// Package etcdstore holds what the one-member etcd stores embedded here share (the core
// store in up, and each tenant control plane's store): short raft ticks, and a
// write-ahead log and snapshots kept small, so that what a store reads when it starts is
// bounded whatever its age.
//
// etcd finds its last snapshot by reading every retained write-ahead log segment, then
// replays every entry after that snapshot. With etcd's defaults (64 MB segments, a
// snapshot every 10,000 entries) one segment holds every write of a young store and
// nothing is ever cut or purged: a store's start grew with each write it had taken (the
// core store's from 60 ms to 400 ms after 24,000 writes). Here a segment is cut at
// [SegmentBytes], a snapshot is taken every [SnapshotEntries] entries, and a segment is
// purged once a snapshot covers it, so a start reads at most a few segments.
package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/pkg/v3/traceutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
)

const (
	// SegmentBytes is the size of a write-ahead log segment (etcd's is 64 MB). Each segment
	// is preallocated, so it is also the room a new store needs for its log.
	SegmentBytes = 4 << 20
	// SnapshotEntries is how many applied entries trigger a snapshot (etcd's default is
	// 10,000): the most entries a start replays.
	SnapshotEntries = 1000
	// catchUpEntries is how many entries stay in memory after a snapshot for a slow
	// follower (etcd's default is 5,000); one member has no follower.
	catchUpEntries = 100
	// keptFiles is how many snapshots and write-ahead log segments are kept once a
	// snapshot covers them. etcd never purges a segment a later snapshot does not cover.
	keptFiles = 2
	// KeptRevisions is how much history a store keeps when it starts: a client whose watch
	// the restart ended resumes from a revision within it without listing again.
	KeptRevisions = 1000
)

// The segment size is a package variable of etcd's, read on every write: it is set once,
// before any store of this process starts.
func init() { wal.SegmentSizeBytes = SegmentBytes }

// Configure sets cfg for a one-member store: ticks short enough that its first election
// (and so a start) takes tens of milliseconds rather than a second, and the bounded log.
func Configure(cfg *embed.Config) {
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.SnapshotCount = SnapshotEntries
	cfg.SnapshotCatchUpEntries = catchUpEntries
	cfg.MaxSnapFiles, cfg.MaxWalFiles = keptFiles, keptFiles
}

// Start starts the store cfg describes (Configure sets it), waits up to within for it to
// serve, then compacts its history (CompactHistory). A store that does not serve is
// closed. A compaction that fails does not fail the start (the API server compacts as it
// runs): it is logged as an error in the store's own log.
func Start(ctx context.Context, cfg *embed.Config, within time.Duration) (*embed.Etcd, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting etcd in %s: %w", cfg.Dir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcd: %w", err)
	case <-time.After(within):
		e.Close()
		err := fmt.Errorf("etcd in %s did not become ready within %s", cfg.Dir, within)
		if len(cfg.LogOutputs) == 1 && cfg.LogOutputs[0] != embed.DefaultLogOutput {
			err = fmt.Errorf("%w (see %s)", err, cfg.LogOutputs[0])
		}
		return nil, err
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	}
	if err := CompactHistory(ctx, e); err != nil {
		e.GetLogger().Error("the store keeps its history until the API server compacts it", zap.Error(err))
	}
	return e, nil
}

// CompactHistory compacts away the history of e older than its last KeptRevisions
// revisions, if it holds more. etcd rebuilds its index from every revision it holds when it
// starts, and the API server compacts only every five minutes, so a process that restarts
// often (a crash loop, a tenant cluster that sleeps and wakes) carried its history from
// start to start and started more slowly each time. The compaction is logical at once and
// physical in etcd's background.
func CompactHistory(ctx context.Context, e *embed.Etcd) error {
	rev, compacted := history(e.Server.KV())
	if rev-KeptRevisions <= compacted {
		return nil
	}
	_, err := e.Server.Compact(ctx, &pb.CompactionRequest{Revision: rev - KeptRevisions})
	if err != nil && !errors.Is(err, mvcc.ErrCompacted) {
		return fmt.Errorf("compacting the store's history to revision %d: %w", rev-KeptRevisions, err)
	}
	return nil
}

// history is the store's current revision and the revision its history was last
// compacted to (-1: never).
func history(kv mvcc.KV) (rev, compacted int64) {
	txn := kv.Read(mvcc.ConcurrentReadTxMode, traceutil.TODO())
	defer txn.End()
	return txn.Rev(), txn.FirstRev()
}
