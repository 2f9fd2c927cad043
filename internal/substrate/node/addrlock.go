package node

import "socialweb.computer/internal/dirlock"

// addressLockPath is the host-wide lock over the node address ranges (10.78.0.0/16 for
// namespace nodes, 10.79.0.0/16 for vm nodes). Every state dir on a host allocates from the
// same ranges, and freeIndex sees another state dir's node only once that node's host end
// holds its address; two bidders (or two tests) booting at once would pick the same block
// without it, and Linux lets one address sit on two links.
const addressLockPath = "/run/socialweb/node-addresses.lock"

// lockAddresses blocks until this process holds the host's node address lock, and returns
// its release. Boot holds it from picking a block until the block's address is on the host
// end of the node's link.
func lockAddresses() (func(), error) { return dirlock.WaitFile(addressLockPath) }
