package podnet

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
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

// Open opens the inner bind on a thread that entered the namespace, then returns the
// thread (or retires it, if it cannot).
func (b *netnsBind) Open(port uint16) (fns []conn.ReceiveFunc, actual uint16, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, oerr := os.Open("/proc/thread-self/ns/net")
		if oerr != nil {
			err = oerr
			return
		}
		defer orig.Close()
		if serr := unix.Setns(int(b.ns.Fd()), unix.CLONE_NEWNET); serr != nil {
			err = fmt.Errorf("enter the node's network namespace: %w", serr)
			return
		}
		fns, actual, err = b.Bind.Open(port)
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
	return fns, actual, err
}
