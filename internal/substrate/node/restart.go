package node

import (
	"fmt"
	"os/exec"
	"sync"
	"time"
)

// A node's network services (the pod network, kube-proxy, the DNS server, NetworkPolicy)
// are restarted when they end, as systemd restarts k3s's: their state is rebuilt from the
// cluster on start, and a crash of one should cost its function for a second, not the node
// and every pod on it. containerd and the kubelet are not: their end ends the node, which
// its NodeClaim replaces.

// Restart policy: the first restart after restartFirst, doubling up to restartMax; more
// than restartBudget restarts within restartWindow and the node fails instead.
const (
	restartFirst  = time.Second
	restartMax    = 30 * time.Second
	restartBudget = 5
	restartWindow = 10 * time.Minute
)

// restartAfter decides, for a service that ended at now after restarts at the times prev,
// whether to start it again and after how long (pure).
func restartAfter(prev []time.Time, now time.Time) (time.Duration, bool) {
	recent := 0
	for _, t := range prev {
		if now.Sub(t) < restartWindow {
			recent++
		}
	}
	if recent >= restartBudget {
		return 0, false
	}
	d := restartFirst
	for i := 0; i < recent && d < restartMax; i++ {
		d *= 2
	}
	return min(d, restartMax), true
}

// restartable is a service the agent starts again when it ends (restartAfter).
type restartable struct {
	a             *agent
	name, logName string
	argv          []string

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool
	restarts []time.Time
}

// spawnRestartable starts a service like spawn, and again whenever it ends until halt.
func (a *agent) spawnRestartable(name, logName string, argv ...string) (*restartable, error) {
	r := &restartable{a: a, name: name, logName: logName, argv: argv}
	cmd, err := a.spawnWith(name, logName, r.ended, argv...)
	if err != nil {
		return nil, err
	}
	r.cmd = cmd
	return r, nil
}

func (r *restartable) ended(why string) {
	r.mu.Lock()
	now := time.Now()
	delay, again := restartAfter(r.restarts, now)
	if r.stopping {
		r.mu.Unlock()
		return
	}
	if !again {
		r.mu.Unlock()
		r.a.ended <- fmt.Sprintf("%s; it ended %d times within %s", why, restartBudget+1, restartWindow)
		return
	}
	r.restarts = append(r.restarts, now)
	r.mu.Unlock()
	r.a.logf("%s; starting it again in %s", why, delay)
	time.Sleep(delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return
	}
	cmd, err := r.a.spawnWith(r.name, r.logName, r.ended, r.argv...)
	if err != nil {
		go func() { r.a.ended <- fmt.Sprintf("%s could not be started again: %v", r.name, err) }()
		return
	}
	r.cmd = cmd
	r.a.logf("%s started again (pid %d)", r.name, cmd.Process.Pid)
}

// halt ends the restarts and returns the running process, for teardown to stop (nil-safe).
func (r *restartable) halt() *exec.Cmd {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = true
	return r.cmd
}
