package diskspace

import (
	"context"
	"errors"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestHuman(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 4096: "4 KiB", 8 * MiB: "8 MiB", 1536 * MiB: "1.5 GiB", 20 << 30: "20 GiB"} {
		if got := Human(n); got != want {
			t.Errorf("Human(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestRequire(t *testing.T) {
	dir := t.TempDir()
	if err := Require(dir, 1, "a byte"); err != nil {
		t.Fatalf("a byte: %v", err)
	}
	err := Require(dir, 1<<62, "the store")
	var low *LowError
	if !errors.As(err, &low) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("4 EiB: %v, want a LowError that is ENOSPC", err)
	}
	if msg := err.Error(); !strings.Contains(msg, dir) || !strings.Contains(msg, "the store needs at least") {
		t.Fatalf("message %q names neither the path nor what needs the room", msg)
	}
	if err := Require(dir+"/missing", 1, "x"); err == nil || errors.As(err, &low) {
		t.Fatalf("a missing dir: %v, want the statfs error", err)
	}
}

func TestLevelOf(t *testing.T) {
	if LevelOf(10, 5) != Enough || LevelOf(4, 5) != Low || LevelOf(5, 5) != Enough {
		t.Fatal("LevelOf")
	}
}

// Watch reports the first measure and then only changes.
func TestWatchReportsChangesOnly(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var calls []Level
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, dir, 1<<62, time.Millisecond, func(_ Room, l Level, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Error(err)
			}
			calls = append(calls, l)
		})
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	<-done
	if len(calls) != 1 || calls[0] != Low {
		t.Fatalf("calls %v, want one Low", calls)
	}
}
