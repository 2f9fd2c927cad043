package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/substrate/guestproc"
)

// A node outlives the process that booted it (its agent runs under its own supervisor, so a
// bidder's restart adopts it), and so does its host state: network namespace, veth, INPUT
// rules, egress chain, overlay forwarding, cgroups, run dir, mounts. When the node dies with
// its host process (a crash, a SIGKILL of the whole tree), nothing stops it and that state
// stays. The sweep removes it for the guests of this substrate's own state dir whose agent
// no longer runs. It never touches another state dir's nodes: several bidders (several
// `up`s) may share a host, and only a guest dir of our own names a node we may prove dead
// (its node.json names its host state, its pid.json its agent).

// Host state a guest may have left, as sweepFacts names it.
const (
	leftNetns   = "netns"
	leftLink    = "link"
	leftRunDir  = "run dir"
	leftCgroups = "cgroups"
	leftChain   = "iptables chain"
	leftFilter  = "INPUT rules"
	leftProcs   = "processes"
	leftMounts  = "mounts"
	leftWork    = "work dir"
)

// sweepFacts is what the sweep decision needs to know of one guest of the state dir.
type sweepFacts struct {
	ID string
	// Known: its node.json reads, so the names of its host state are known.
	Known bool
	// Alive: its agent's supervisor runs (the pid record's process, same start time).
	Alive bool
	// Left is its host state still present (left* names).
	Left []string
}

// sweepPlan decides, from the facts of the state dir's guests, which to stop (release: every
// running one, for a host or a test giving its nodes up) and which to sweep (not running,
// with host state left). A guest whose node.json does not read is neither: nothing names its
// host state. Pure.
func sweepPlan(guests []sweepFacts, release bool) (stop, sweep []string) {
	for _, g := range guests {
		switch {
		case !g.Known:
		case g.Alive && release:
			stop = append(stop, g.ID)
		case g.Alive:
			// Adopted: a running node keeps everything.
		case len(g.Left) > 0:
			sweep = append(sweep, g.ID)
		}
	}
	return stop, sweep
}

// Swept is one guest the sweep acted on: stopped (it ran, and release asked for it) or swept
// (it was dead), with the host state it had left and what failed.
type Swept struct {
	ID      string
	Stopped bool
	Left    []string
	Err     error
}

func (s Swept) String() string {
	what := "swept"
	if s.Stopped {
		what = "stopped"
	}
	line := fmt.Sprintf("%s node %s (left: %s)", what, s.ID, strings.Join(s.Left, ", "))
	if s.Err != nil {
		line += ": " + s.Err.Error()
	}
	return line
}

// Sweep removes the host state of this substrate's own nodes that no longer run (see
// sweepPlan); with release it first stops the running ones, which removes theirs. It is
// meant for a start, before the bidder adopts its guests, and for a host or a test giving
// up its nodes; a node this substrate boots meanwhile could be taken for dead between its
// network and its agent's start. The joined error is every sweep's that failed.
func (s *Substrate) Sweep(ctx context.Context, release bool) ([]Swept, error) {
	ids, err := s.store.IDs()
	if err != nil {
		return nil, err
	}
	host := readSweepHost()
	facts := make([]sweepFacts, 0, len(ids))
	type known struct {
		state nodeState
		left  []string
	}
	byID := map[string]known{}
	for _, id := range ids {
		dir := s.store.Dir(id)
		f := sweepFacts{ID: id}
		var ns nodeState
		if guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns) == nil && ns.Dir != "" {
			f.Known = true
			var rec guestproc.Record
			_ = guestproc.ReadJSON(filepath.Join(dir, guestproc.PidFile), &rec)
			// A supervisor killed alone leaves its agent running: the node is alive.
			f.Alive = rec.Alive() || host.agentRuns(ns.Dir)
			if !f.Alive {
				f.Left = host.left(ns)
			}
			byID[id] = known{state: ns, left: f.Left}
		}
		facts = append(facts, f)
	}
	stop, sweep := sweepPlan(facts, release)
	var out []Swept
	var errs []error
	for _, id := range stop {
		sw := Swept{ID: id, Stopped: true}
		if err := s.Stop(ctx, id); err != nil {
			sw.Err = err
			errs = append(errs, err)
		}
		out = append(out, sw)
	}
	for _, id := range sweep {
		k := byID[id]
		sw := Swept{ID: id, Left: k.left}
		if err := teardownHost(k.state); err != nil {
			sw.Err = fmt.Errorf("sweep node %s: %w", id, err)
			errs = append(errs, sw.Err)
		}
		out = append(out, sw)
	}
	return out, errors.Join(errs...)
}

// SweepDead is Sweep at a start, before the bidder adopts its guests: each node swept is
// said as a line, and a failure too (it does not stop the start: the nodes left are swept
// at the next).
func (s *Substrate) SweepDead(ctx context.Context, say func(line string)) {
	swept, err := s.Sweep(ctx, false)
	for _, sw := range swept {
		say(sw.String())
	}
	if err != nil {
		say("sweeping dead nodes: " + err.Error())
	}
}

// SweepStateDir is Sweep of the node substrate whose state dir is stateDir, without the
// host checks New makes (a host that lost its containerd still sweeps): for `socialweb
// node sweep`, run while no bidder runs on stateDir.
func SweepStateDir(ctx context.Context, stateDir string, release bool) ([]Swept, error) {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, err
	}
	s := &Substrate{cfg: Config{StateDir: abs, StopGrace: 20 * time.Second}, store: guestproc.Store{Root: abs}}
	return s.Sweep(ctx, release)
}

// sweepHost is the host listing the facts of every guest are read from, once per sweep.
type sweepHost struct {
	cmdlines []string // every process's command line
	mounts   []string // every mount point
}

func readSweepHost() sweepHost {
	var h sweepHost
	self := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name() == self {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && len(b) > 0 {
			h.cmdlines = append(h.cmdlines, string(b))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 {
				h.mounts = append(h.mounts, unescapeMount(f[4]))
			}
		}
	}
	return h
}

// agentRuns says whether a node agent of the guest dir dir runs.
func (h sweepHost) agentRuns(dir string) bool {
	for _, c := range h.cmdlines {
		if strings.Contains(c, "node-agent\x00"+dir+"\x00") {
			return true
		}
	}
	return false
}

// left lists what of ns's host state is present.
func (h sweepHost) left(ns nodeState) []string {
	var left []string
	exists := func(p string) bool {
		if p == "" {
			return false
		}
		_, err := os.Stat(p)
		return err == nil
	}
	if ns.Netns != "" && exists("/run/netns/"+ns.Netns) {
		left = append(left, leftNetns)
	}
	if ns.HostLink != "" {
		if _, err := net.InterfaceByName(ns.HostLink); err == nil {
			left = append(left, leftLink)
		}
		if exec.Command("iptables", "-w", "-n", "-L", podnet.NodeChain(ns.HostLink)).Run() == nil {
			left = append(left, leftChain)
		}
		if exec.Command("iptables", append([]string{"-w", "-C", "INPUT"}, hostFilterRules(ns.HostLink)[1]...)...).Run() == nil {
			left = append(left, leftFilter)
		}
	}
	if exists(ns.RunDir) {
		left = append(left, leftRunDir)
	}
	var cgroups []string
	if guestproc.ReadJSON(filepath.Join(ns.Dir, cgroupsFile), &cgroups) == nil {
		for _, c := range cgroups {
			if exists(c) {
				left = append(left, leftCgroups)
				break
			}
		}
	}
	if exists(filepath.Join(ns.Dir, workDir)) || exists(filepath.Join(ns.Dir, diskImage)) {
		left = append(left, leftWork)
	}
	for _, c := range h.cmdlines {
		if strings.Contains(c, "node-agent\x00") {
			continue
		}
		if strings.Contains(c, ns.Dir) || (ns.RunDir != "" && strings.Contains(c, ns.RunDir)) {
			left = append(left, leftProcs)
			break
		}
	}
	for _, m := range h.mounts {
		if under(m, ns.Dir) || (ns.RunDir != "" && under(m, ns.RunDir)) {
			left = append(left, leftMounts)
			break
		}
	}
	return left
}

func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}
