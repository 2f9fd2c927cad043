package infra

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
)

// countingRepo counts the writes that reach a real repo.
type countingRepo struct {
	repos.Repo
	puts atomic.Int64
	gets atomic.Int64
}

func (c *countingRepo) Get(ctx context.Context, collection, rkey string) (*repos.Record, error) {
	c.gets.Add(1)
	return c.Repo.Get(ctx, collection, rkey)
}

func (c *countingRepo) Put(ctx context.Context, collection, rkey string, value json.RawMessage, swapCID *string) (*repos.WriteResult, error) {
	c.puts.Add(1)
	return c.Repo.Put(ctx, collection, rkey, value, swapCID)
}

// ownerRepo is the repo of an account on a real PDS of the test's own, counting its reads
// and writes.
func ownerRepo(t *testing.T) *countingRepo {
	t.Helper()
	ctx := context.Background()
	srv, err := pds.New(pds.Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	if _, err := srv.CreateAccount(ctx, "owner.test", "password"); err != nil {
		t.Fatal(err)
	}
	local, err := repos.Local(ctx, srv, "owner.test")
	if err != nil {
		t.Fatal(err)
	}
	return &countingRepo{Repo: local}
}

// Concurrent index changes of one account all land, in fewer writes than changes.
func TestIndexWriterCoalesces(t *testing.T) {
	ctx := context.Background()
	repo := ownerRepo(t)

	const n = 64
	w := NewIndexWriter()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			entry := infra.IndexEntryFor(infra.KindInfra, fmt.Sprintf("d%03d", i), now, nil, "test")
			errs <- w.Update(ctx, repo, now, func(idx *atinfra.InfraIndex) (*atinfra.InfraIndex, bool) {
				return infra.IndexPass(idx, entry, true, now)
			})
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	idx, _, _, err := ReadIndex(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	if idx == nil || len(idx.Live) != n {
		t.Fatalf("index holds %d live entries, want %d", len(idx.Live), n)
	}
	if p := repo.puts.Load(); p >= n/2 {
		t.Fatalf("%d changes took %d writes of the index, want them coalesced (< %d)", n, p, n/2)
	}
	t.Logf("%d changes in %d writes", n, repo.puts.Load())
}

// TestIndexWriterKeepsWhatItWrote checks that batches after the first start from the index the
// writer last wrote, without reading self, and that a write at self by someone else is not
// lost: the swap on the kept cid fails and the batch starts again from a fresh read.
func TestIndexWriterKeepsWhatItWrote(t *testing.T) {
	ctx := context.Background()
	repo := ownerRepo(t)
	w := NewIndexWriter()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	add := func(w *IndexWriter, rkey string) {
		t.Helper()
		entry := infra.IndexEntryFor(infra.KindInfra, rkey, now, nil, "test")
		if err := w.Update(ctx, repo, now, func(idx *atinfra.InfraIndex) (*atinfra.InfraIndex, bool) {
			return infra.IndexPass(idx, entry, true, now)
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 10; i++ {
		add(w, fmt.Sprintf("d%03d", i))
	}
	if g := repo.gets.Load(); g != 1 {
		t.Fatalf("10 batches read self %d times, want once", g)
	}
	// Another writer (a second controller process) moves the index on.
	add(NewIndexWriter(), "other")
	add(w, "d010")
	idx, _, _, err := ReadIndex(ctx, repo)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, e := range idx.Live {
		names[e.Rkey] = true
	}
	if len(idx.Live) != 12 || !names["other"] || !names["d010"] || !names["d000"] {
		t.Fatalf("index holds %d live entries (%v), want the 11 of this writer and the other's", len(idx.Live), names)
	}
}
