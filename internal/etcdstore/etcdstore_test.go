package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.etcd.io/etcd/server/v3/storage/wal/walpb"
	"go.uber.org/zap"
)

// A store that has taken many times SnapshotEntries writes, and several segments' worth of
// bytes, reads a bounded log when it starts again: the last snapshot is recent, and the
// segments it covers are purged. With etcd's defaults the log would hold every write.
func TestStartReadsABoundedLog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	dir := t.TempDir()
	const writes, value = 3 * SnapshotEntries, 8 << 10 // 24 MiB: six segments
	e := start(t, dir)
	put(t, e, writes, value)
	e.Close()

	e = start(t, dir)
	defer e.Close()
	walDir := filepath.Join(dir, "member", "wal")
	// Every retained segment is read at each start: those kept, and the one the last
	// snapshot is in; a segment is cut once a batch of writes takes it past its size. The
	// purge runs as the store starts, in the background.
	const bound = (keptFiles + 1) * (SegmentBytes + SegmentBytes/8)
	var logBytes int64
	var segments []string
	for end := time.Now().Add(10 * time.Second); ; {
		segments, logBytes = walSegments(t, walDir)
		if logBytes <= bound || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if logBytes > bound {
		t.Errorf("the write-ahead log holds %d bytes after %d writes of %d bytes, want at most %d: %v", logBytes, writes, value, bound, segments)
	}

	snaps, err := wal.ValidSnapshotEntries(zap.NewNop(), walDir)
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots in the log: %v, %v", snaps, err)
	}
	last := snaps[len(snaps)-1]
	if last.GetIndex() < writes-SnapshotEntries {
		t.Errorf("the last snapshot is at index %d, want one within %d entries of the %d writes", last.GetIndex(), SnapshotEntries, writes)
	}
	r, err := wal.OpenForRead(zap.NewNop(), walDir, &walpb.Snapshot{Index: last.Index, Term: last.Term})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, _, ents, err := r.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) > SnapshotEntries+50 {
		t.Errorf("a start replays %d entries, want at most about %d", len(ents), SnapshotEntries)
	}
}

func start(t *testing.T, dir string) *embed.Etcd {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(dir, "..", "etcd.log")}
	sock := filepath.Join(t.TempDir(), "s")
	client, peer := url.URL{Scheme: "unix", Path: sock}, url.URL{Scheme: "unix", Path: sock + ".peer"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	Configure(cfg)
	e, err := Start(context.Background(), cfg, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// put writes n keys of size bytes each from a few clients at once.
func put(t *testing.T, e *embed.Etcd, n, size int) {
	t.Helper()
	c := newClient(t, e)
	v := strings.Repeat("v", size)
	const writers = 8
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += writers {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := c.Put(ctx, fmt.Sprintf("k%d", i), v)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func newClient(t *testing.T, e *embed.Etcd) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Config().ListenClientUrls[0].String()}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// walSegments lists the write-ahead log's segments and their size in all (each is
// preallocated to its full size).
func walSegments(t *testing.T, dir string) (names []string, size int64) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".wal") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		names, size = append(names, e.Name()), size+fi.Size()
	}
	return names, size
}

// A store that holds more than KeptRevisions of history keeps only the last KeptRevisions
// once compacted as it starts; a younger one keeps all of it.
func TestCompactHistoryKeepsTheLastRevisions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd")
	}
	e := start(t, t.TempDir())
	defer e.Close()
	ctx := context.Background()
	put(t, e, KeptRevisions/2, 16)
	if err := CompactHistory(ctx, e); err != nil {
		t.Fatal(err)
	}
	if rev, compacted := history(e.Server.KV()); compacted > 0 {
		t.Errorf("a store at revision %d was compacted to %d", rev, compacted)
	}

	put(t, e, 2*KeptRevisions, 16)
	if err := CompactHistory(ctx, e); err != nil {
		t.Fatal(err)
	}
	rev, compacted := history(e.Server.KV())
	if compacted != rev-KeptRevisions {
		t.Errorf("a store at revision %d was compacted to %d, want %d", rev, compacted, rev-KeptRevisions)
	}
	// As a client sees it: a read at a revision before the kept ones is refused, one within
	// them answered.
	c := newClient(t, e)
	if _, err := c.Get(ctx, "k0", clientv3.WithRev(rev-KeptRevisions-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Errorf("a read at revision %d of a store at %d: %v, want %v", rev-KeptRevisions-1, rev, err, rpctypes.ErrCompacted)
	}
	if _, err := c.Get(ctx, "k0", clientv3.WithRev(rev-KeptRevisions+1)); err != nil {
		t.Errorf("a read at revision %d of a store at %d: %v", rev-KeptRevisions+1, rev, err)
	}
	// Again, with nothing more to compact: no error.
	if err := CompactHistory(ctx, e); err != nil {
		t.Fatal(err)
	}
}
