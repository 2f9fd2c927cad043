package dirlock

import (
	"errors"
	"fmt"
	"os"
	"testing"
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
