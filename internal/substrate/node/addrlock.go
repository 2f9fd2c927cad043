package node

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// addressLockPath is the host-wide lock over the node address ranges (10.78.0.0/16 for
// namespace nodes, 10.79.0.0/16 for vm nodes). Every state dir on a host allocates from the
// same ranges, and freeIndex sees another state dir's node only once that node's host end
// holds its address; two bidders (or two tests) booting at once would pick the same block
// without it, and Linux lets one address sit on two links.
const addressLockPath = "/run/socialweb/node-addresses.lock"

// lockAddresses blocks until this process holds the host's node address lock, and returns
// its release. Boot holds it from picking a block until the block's address is on the host
// end of the node's link.
func lockAddresses() (func(), error) {
	if err := os.MkdirAll(filepath.Dir(addressLockPath), 0o700); err != nil {
		return nil, fmt.Errorf("node address lock: %w", err)
	}
	f, err := os.OpenFile(addressLockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("node address lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("node address lock %s: %w", addressLockPath, err)
	}
	// Closing the file releases the lock; so does this process's exit.
	return func() { f.Close() }, nil
}
