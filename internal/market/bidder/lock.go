package bidder

import (
	"errors"
	"fmt"
	"os"

	"socialweb.computer/internal/dirlock"
)

// StateDirHeldError is a bidder state dir another live bidder holds.
type StateDirHeldError struct {
	Dir string
	// Holder is "pid N" (or "another process").
	Holder string
}

func (e *StateDirHeldError) Error() string {
	return fmt.Sprintf("bidder state dir %s is held by %s: one bidder runs per state dir, and one per account (two bidders of one DID bid twice on every rfp); stop that one or give this one another account and --state-dir", e.Dir, e.Holder)
}

// Is makes errors.Is(err, dirlock.ErrHeld) true.
func (e *StateDirHeldError) Is(target error) bool { return target == dirlock.ErrHeld }

// LockStateDir creates the state dir and holds it for this process (internal/dirlock, the
// same lock as the core's data dir), so a second bidder on it is refused at once, named the
// holder's pid, instead of running beside the first: both would find the same guests and
// answer the same rfps from one DID. Release the lock when the bidder stops.
func LockStateDir(dir string) (*dirlock.Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	l, err := dirlock.Acquire(dir)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return nil, &StateDirHeldError{Dir: dir, Holder: held.Holder}
	}
	return l, err
}
