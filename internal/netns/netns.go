// Package netns runs a function inside a Linux network namespace and comes back.
//
// A namespace is a property of an OS thread, not of a goroutine, so the function runs on a
// goroutine of its own locked to its thread. Sockets it opens stay in the namespace; the
// thread goes back to its own namespace before it runs anything else, and one that cannot
// stays locked and ends with its goroutine, so no other goroutine ever runs in the wrong
// namespace. (A thread left in the namespace that happened to be the process's first would
// make /proc/self/net, which is that thread's view, show the namespace's sockets.)
package netns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs fn in the network namespace at path (a /proc/PID/ns/net or a bind mount of one)
// and returns its error, or why the namespace could not be entered or left.
func Do(path string, fn func() error) error {
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer target.Close()
	return DoFile(target, fn)
}

// DoFile is Do with the namespace already open.
func DoFile(ns *os.File, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("network namespace of this thread: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("enter network namespace %s: %w", ns.Name(), err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Locked still: the thread ends with this goroutine.
			done <- fmt.Errorf("leave network namespace %s: %w (and %v)", ns.Name(), err, ferr)
			return
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}
