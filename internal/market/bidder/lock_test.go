package bidder

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"socialweb.computer/internal/dirlock"
)

func TestLockStateDirRefusesASecondBidder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "bidder")
	l, err := LockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = LockStateDir(dir)
	var held *StateDirHeldError
	if !errors.As(err, &held) || !errors.Is(err, dirlock.ErrHeld) {
		t.Fatalf("second bidder on %s: %v, want a StateDirHeldError", dir, err)
	}
	if want := fmt.Sprintf("pid %d", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the holder (%s)", err, want)
	}
	l.Release()
	l, err = LockStateDir(dir)
	if err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	l.Release()
}
