package tenant

import (
	"fmt"
	"time"

	"socialweb.computer/internal/tenant/gate"
)

// StateAsleep: the control plane was stopped for want of use; the gate holds the next
// connection and asks for a wake (Manager.WakeRequested).
const StateAsleep State = "Asleep"

// Idleness is what decides whether a serving cluster may sleep: vcluster's sleep mode, on
// what the gate sees and what the cluster runs.
type Idleness struct {
	// SleepAfter is how long the cluster must go unused before it sleeps; 0 never.
	SleepAfter time.Duration
	Now        time.Time
	// ReadyAt is when the running control plane became Ready: a start is not idleness.
	ReadyAt time.Time
	// OpenConns are the client connections through the gate (a watch counts as use), and
	// LastActive when one last opened or closed.
	OpenConns  int
	LastActive time.Time
	// Nodes are the nodes registered in the cluster, Claims its NodeClaims, and Demand
	// whether the node host is adding nodes or batching pending pods for one: each keeps
	// it awake. LastBusy is when any of them was last seen.
	Nodes, Claims int
	Demand        bool
	LastBusy      time.Time
}

// SleepDecision is DecideSleep's answer.
type SleepDecision struct {
	Sleep bool
	// Why says what keeps the cluster awake, or why it sleeps.
	Why string
	// RecheckAfter is when the decision may change without another event; 0 when only an
	// event (a node, a claim, a setting) can change it.
	RecheckAfter time.Duration
}

// DecideSleep: a cluster sleeps once it has had no node, no claim, no demand for one and
// no client connection through its gate for SleepAfter, counted from the latest of its
// start, its last connection and the last time it was busy.
func DecideSleep(in Idleness) SleepDecision {
	switch {
	case in.SleepAfter <= 0:
		return SleepDecision{Why: "sleep is off (spec.sleepAfter unset)"}
	case in.Nodes > 0:
		return SleepDecision{Why: fmt.Sprintf("%d nodes registered", in.Nodes)}
	case in.Claims > 0:
		return SleepDecision{Why: fmt.Sprintf("%d node claims", in.Claims)}
	case in.Demand:
		return SleepDecision{Why: "pending pods are waiting for a node"}
	case in.OpenConns > 0:
		// A connection's close is seen at the next check: at most SleepAfter late.
		return SleepDecision{Why: fmt.Sprintf("%d client connections open", in.OpenConns), RecheckAfter: in.SleepAfter}
	}
	since := in.ReadyAt
	for _, t := range []time.Time{in.LastActive, in.LastBusy} {
		if t.After(since) {
			since = t
		}
	}
	idle := in.Now.Sub(since)
	if idle < in.SleepAfter {
		return SleepDecision{Why: fmt.Sprintf("unused for %s of %s", idle.Round(time.Second), in.SleepAfter), RecheckAfter: in.SleepAfter - idle}
	}
	return SleepDecision{Sleep: true, Why: fmt.Sprintf("no request, node or pending pod for %s", in.SleepAfter)}
}

// Sleep stops a cluster's control plane for want of use and keeps its store; the gate
// holds the connections that come meanwhile and asks for a wake, which WakeRequested then
// reports and Start (the controller's) clears. Idempotent; blocks until the process group
// is reaped. A cluster the manager does not run yet (a restarted gateway's sleeping
// cluster) gets its gate, asleep.
func (m *Manager) Sleep(k Key, o StartOptions) error {
	in, err := m.ensure(k, m.policy(o))
	if err != nil {
		return err
	}
	// Asleep before the stop: a client that comes during it is held and asks for the wake.
	in.mu.Lock()
	in.asleep = true
	in.gate.Set(gate.Asleep, "")
	in.mu.Unlock()
	m.halt(in)
	in.mu.Lock()
	in.status.State = StateAsleep
	in.mu.Unlock()
	return nil
}

// WakeRequested says whether a client came through an asleep cluster's gate since it fell
// asleep (or since the last Start).
func (m *Manager) WakeRequested(k Key) bool {
	return m.holds(k, func(in *instance) bool { return in.wake })
}

// Running says whether the cluster's control plane is started and not asked to stop
// (starting, ready, or crashed and restarting): not stopped, asleep, or being stopped.
func (m *Manager) Running(k Key) bool {
	return m.holds(k, func(in *instance) bool { return in.stop != nil })
}

// holds reads what f says of k's instance under its lock; false when the manager does not
// run the cluster.
func (m *Manager) holds(k Key, f func(*instance) bool) bool {
	in := m.get(k)
	if in == nil {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return f(in)
}

// Activity is how many client connections the cluster's gate has open and when one last
// opened or closed; zero when the manager does not run the cluster.
func (m *Manager) Activity(k Key) (open int, last time.Time) {
	in := m.get(k)
	if in == nil {
		return 0, time.Time{}
	}
	return in.gate.Activity()
}

// wakeOnRequest makes in's gate ask for a wake: recorded, and the cluster's key sent to
// the controller.
func (m *Manager) wakeOnRequest(in *instance) {
	in.gate.OnWake(func() {
		in.mu.Lock()
		in.wake = true
		in.mu.Unlock()
		m.notify(in.key)
	})
}
