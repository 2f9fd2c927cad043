package podnet

import (
	"os"

	"golang.zx2c4.com/wireguard/conn"
	"socialweb.computer/internal/netns"
)

// netnsBind is wireguard-go's UDP bind with its sockets always opened in one network
// namespace, the node's. wireguard-go reopens them from its own goroutines (when the TUN
// device goes down and up again), on whatever thread runs them; a process wholly inside the
// node's namespace needs nothing of the kind, but one that entered it on a single thread
// would otherwise reopen them in another namespace.
type netnsBind struct {
	conn.Bind
	ns *os.File // the namespace, opened at creation
}

// newNetnsBind binds in the network namespace of the calling thread.
func newNetnsBind() (*netnsBind, error) {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	return &netnsBind{Bind: conn.NewDefaultBind(), ns: ns}, nil
}

// Open opens the inner bind inside the namespace (netns.DoFile).
func (b *netnsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	err = netns.DoFile(b.ns, func() (err error) {
		fns, actual, err = b.Bind.Open(port)
		return err
	})
	return fns, actual, err
}
