// Package dirlock holds a directory for one process: an exclusive flock on a file in it that
// names the holder's pid. The kernel drops the lock when the process dies, so a crash never
// leaves a stale lock, and a second process is refused at once, told which pid holds it. The
// core's data dir and every bidder's state dir are held this way. WaitFile is the same lock
// taken in turn rather than refused: a host-wide step (node addresses, shared iptables
// chains, a test's fixed addresses) that processes of the host take one at a time.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Name is the lock file's name in the directory it holds.
const Name = "lock"

// ErrHeld is in the chain of the error of a directory another process holds.
var ErrHeld = errors.New("directory is held by another process")

// HeldError is a directory another live process holds.
type HeldError struct {
	Dir string
	// Holder is "pid N", or "another process" when the lock file names none.
	Holder string
}

func (e *HeldError) Error() string { return fmt.Sprintf("%s is held by %s", e.Dir, e.Holder) }

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Lock is a held directory.
type Lock struct{ f *os.File }

// Acquire holds dir (which must exist) for this process until Release or exit, or returns a
// *HeldError naming the holder.
func Acquire(dir string) (*Lock, error) {
	f, err := os.OpenFile(filepath.Join(dir, Name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		f.Close()
		holder := strings.TrimSpace(string(b[:n]))
		if _, perr := strconv.Atoi(holder); perr != nil {
			holder = "another process"
		} else {
			holder = "pid " + holder
		}
		return nil, &HeldError{Dir: dir, Holder: holder}
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return &Lock{f: f}, nil
}

// Release lets the directory go. It is safe on a nil or released Lock.
func (l *Lock) Release() {
	if l == nil || l.f == nil {
		return
	}
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
	l.f = nil
}

// WaitFile blocks until this process holds the lock file at path (made, with its directory,
// when missing), and returns what lets it go. Closing the file drops the lock, and so does
// the process's exit; the file is not passed to children (Go opens it close-on-exec). Two
// callers in one process exclude each other too: the lock is per open file.
func WaitFile(path string) (release func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
