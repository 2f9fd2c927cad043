package pds_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"socialweb.computer/internal/pds"
)

// A consumer that stops reading is dropped with ConsumerTooSlow once it is more than
// SubscriberBuffer frames behind, and no write ever waits on it.
func TestPDSFirehoseDropsASlowConsumerWithoutBlockingWriters(t *testing.T) {
	const buffer = 8
	s, err := pds.New(pds.Config{DataDir: t.TempDir(), SubscriberBuffer: buffer, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	did, err := s.CreateAccount(ctx, "slow.test", "password-1234")
	if err != nil {
		t.Fatal(err)
	}

	stuck := make(chan struct{})
	ended := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		first := true
		ended <- s.SubscribeFrames(ctx, nil, func(pds.Frame) error {
			if first {
				first = false
				close(started)
				<-stuck // the consumer stops reading after its first frame
			}
			return nil
		})
	}()
	repo := s.Repo(did)
	put := func(i int) time.Duration {
		t0 := time.Now()
		if _, _, err := repo.Put(ctx, "com.example.slow", "r", map[string]any{"$type": "com.example.slow", "n": i}, nil); err != nil {
			t.Fatal(err)
		}
		return time.Since(t0)
	}
	// The subscription is live only and may register after a first write: write until it
	// has seen a frame (each value differs, so each write is a commit).
	for i, waiting := -1, true; waiting; i-- {
		put(i)
		select {
		case <-started:
			waiting = false
		case <-time.After(20 * time.Millisecond):
			if i < -500 {
				t.Fatal("the subscriber saw no frame of 500 writes")
			}
		}
	}
	// Far more writes than the buffer holds: each must complete on its own, never waiting for
	// the stuck consumer.
	for i := 1; i <= 4*buffer; i++ {
		if d := put(i); d > 5*time.Second {
			t.Fatalf("write %d took %s: writers wait on the slow consumer", i, d)
		}
	}
	close(stuck)
	select {
	case err := <-ended:
		if !errors.Is(err, pds.ErrConsumerTooSlow) {
			t.Fatalf("slow consumer ended with %v, want ErrConsumerTooSlow", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the slow consumer was never dropped")
	}

	// A consumer that keeps up is not dropped by the same volume of writes.
	fast, cancel := context.WithCancel(ctx)
	got := make(chan int64, 100)
	done := make(chan error, 1)
	go func() {
		done <- s.SubscribeFrames(fast, nil, func(f pds.Frame) error { got <- f.Seq; return nil })
	}()
	time.Sleep(50 * time.Millisecond)
	for i := 0; i < 4*buffer; i++ {
		put(100 + i)
		<-got
	}
	cancel()
	if err := <-done; errors.Is(err, pds.ErrConsumerTooSlow) {
		t.Fatal("a consumer that keeps up was dropped")
	}
}
