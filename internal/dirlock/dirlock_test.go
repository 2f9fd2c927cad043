package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestSecondHolderIsRefusedNamingTheFirst(t *testing.T) {
	dir := t.TempDir()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A second open file description contends like another process would.
	_, err = Acquire(dir)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) {
		t.Fatalf("second Acquire: %v, want a HeldError", err)
	}
	if want := fmt.Sprintf("pid %d", os.Getpid()); held.Holder != want {
		t.Errorf("holder %q, want %q", held.Holder, want)
	}
	l.Release()
	l.Release()
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	l2.Release()
}

// WaitFile makes its directory, and a second taker waits for the first to let go.
func TestWaitFileTakesTurns(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sub", "x.lock")
	release, err := WaitFile(p)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		r, err := WaitFile(p)
		if err != nil {
			t.Error(err)
			r = func() {}
		}
		got <- r
	}()
	select {
	case <-got:
		t.Fatal("a second taker got the lock while the first held it")
	case <-time.After(200 * time.Millisecond):
	}
	release()
	select {
	case r := <-got:
		r()
	case <-time.After(5 * time.Second):
		t.Fatal("the second taker did not get the lock after the first let go")
	}
}
