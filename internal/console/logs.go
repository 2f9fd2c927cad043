package console

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// LogTailLines is how many of a guest's last log lines the console shows.
const LogTailLines = 20

// logInterval is how often the console reads the tails of the guests' logs. A log is a file
// that no watch reports on; the browser still only listens, and a tail that did not change
// sends nothing.
const logInterval = time.Second

// GuestsWithLogs are the ComputeContracts (namespace/name) whose guest may have a log, with
// their accept URIs: an accepted contract not yet released.
func GuestsWithLogs(ccs []v1alpha1.ComputeContract) map[string]string {
	out := map[string]string{}
	for _, cc := range ccs {
		switch cc.Status.Phase {
		case v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractReleasing:
			if cc.Status.Accept != "" {
				out[cc.Namespace+"/"+cc.Name] = cc.Status.Accept
			}
		}
	}
	return out
}

// followLogs reads the tails of the guests' logs every logInterval while a page is open and
// marks the view dirty when one changed.
func (c *Console) followLogs(ctx context.Context) {
	if c.o.GuestLogs == nil {
		return
	}
	wait.UntilWithContext(ctx, c.readLogs, logInterval)
}

// readLogs reads the tails once, when a page is open (nobody to show a tail to otherwise).
func (c *Console) readLogs(ctx context.Context) {
	c.mu.Lock()
	watched := len(c.subs) > 0
	c.mu.Unlock()
	if !watched {
		return
	}
	var cl v1alpha1.ComputeContractList
	if err := c.cache.List(ctx, &cl); err != nil {
		return
	}
	tails := map[string]string{}
	for k, accept := range GuestsWithLogs(cl.Items) {
		b, err := c.o.GuestLogs(ctx, accept, LogTailLines)
		if err == nil && len(b) > 0 {
			tails[k] = string(b)
		}
	}
	c.mu.Lock()
	changed := len(tails) != len(c.logs)
	for k, v := range tails {
		if c.logs[k] != v {
			changed = true
		}
	}
	c.logs = tails
	c.mu.Unlock()
	if changed {
		c.changed()
	}
}
