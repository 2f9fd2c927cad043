// Package diskspace says how much room a directory's file system has left, refuses to start
// a store that has no room to begin, and warns while the room runs out: a full disk must
// end in one line naming the path and the cause, never in a stack trace or a silent exit.
package diskspace

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// MiB is a mebibyte.
const MiB = 1 << 20

// Room is what a file system has: free for an unprivileged writer, and in all.
type Room struct {
	Free, Total uint64
}

// Of returns the room of the file system holding path.
func Of(path string) (Room, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Room{}, fmt.Errorf("free space of %s: %w", path, err)
	}
	return Room{Free: st.Bavail * uint64(st.Bsize), Total: st.Blocks * uint64(st.Bsize)}, nil
}

// LowError is a file system with less room than something needs.
type LowError struct {
	// Path is the directory the room was measured at.
	Path string
	// Free is what its file system has free; Need is what What needs.
	Free, Need uint64
	What       string
}

func (e *LowError) Error() string {
	return fmt.Sprintf("%s: %s free on its file system, and %s needs at least %s: free some space there or choose another place",
		e.Path, Human(e.Free), e.What, Human(e.Need))
}

// Is makes a LowError an ENOSPC to errors.Is.
func (e *LowError) Is(target error) bool { return target == syscall.ENOSPC }

// Require fails with a *LowError when the file system holding path has less than need free.
func Require(path string, need uint64, what string) error {
	r, err := Of(path)
	if err != nil {
		return err
	}
	if r.Free < need {
		return &LowError{Path: path, Free: r.Free, Need: need, What: what}
	}
	return nil
}

// Human writes n bytes in the largest binary unit that keeps it at least 1.
func Human(n uint64) string {
	switch {
	case n >= 10<<30:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= MiB:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// Level is how a file system's room stands against a warning threshold.
type Level int

const (
	// Enough: at least the threshold free.
	Enough Level = iota
	// Low: less than the threshold free.
	Low
)

// LevelOf is where free stands against warnBelow.
func LevelOf(free, warnBelow uint64) Level {
	if free < warnBelow {
		return Low
	}
	return Enough
}

// Watch measures path's room every interval until ctx ends and calls change on the first
// measure and each time the level changes (a warning once when the room gets low, a note
// once when it comes back), not at every measure. A failed measure is passed as err, once
// until a measure succeeds again.
func Watch(ctx context.Context, path string, warnBelow uint64, interval time.Duration, change func(Room, Level, error)) {
	last, lastErr := Level(-1), error(nil)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		r, err := Of(path)
		switch {
		case err != nil:
			if lastErr == nil || !errors.Is(err, lastErr) {
				change(Room{}, last, err)
			}
			lastErr = err
		default:
			lastErr = nil
			if l := LevelOf(r.Free, warnBelow); l != last {
				change(r, l, nil)
				last = l
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
