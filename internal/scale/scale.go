package scale

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Batching of pending pods, as Karpenter batches them: the decision acts once no new pending
// pod has appeared for BatchIdle, and at the latest BatchMax after the first one.
const (
	BatchIdle = time.Second
	BatchMax  = 10 * time.Second
	// SettledIdle replaces BatchIdle when every pending pod's controller is settled
	// (Pod.OwnerSettled): none of them has a pod on its way, so the batch waits only for
	// what other objects of the same apply may still bring.
	SettledIdle = 250 * time.Millisecond
)

// ReplaceRetry is how long a replacement that found no bid under its cap waits before the
// same nodes are offered to the market again: a failed try costs the market an rfp, and
// prices move slowly.
const ReplaceRetry = 10 * time.Minute

// DrainRetry is how often a draining node's evictions are asked again (a
// PodDisruptionBudget refused some).
const DrainRetry = 5 * time.Second

// SchedulerSettle is how long after a node became Ready the scheduler is taken to have tried
// every pending pod on it. The scheduler requeues unschedulable pods on a node's add or
// update within a second or two; a pod still Unschedulable after that does not fit the node
// (its resources, affinity, taints, ports), whatever free slots PodsPerNode counts there.
const SchedulerSettle = 5 * time.Second

// Resources are a pod's requests or a node's allocatable CPU and memory.
type Resources struct {
	MilliCPU int64
	MemBytes int64
}

// known says whether r says anything (a node size of zero is unknown).
func (r Resources) known() bool { return r.MilliCPU > 0 || r.MemBytes > 0 }

// fitsIn says whether requests r fit allocatable a (a resource a leaves unknown, 0, bounds
// nothing).
func (r Resources) fitsIn(a Resources) bool {
	return (a.MilliCPU <= 0 || r.MilliCPU <= a.MilliCPU) && (a.MemBytes <= 0 || r.MemBytes <= a.MemBytes)
}

// Pod is one pod of the tenant cluster, as the decision needs it.
type Pod struct {
	// Name identifies the pod (namespace/name); only used in tests and logs.
	Name string
	// Node is spec.nodeName; empty while the pod is not bound.
	Node string
	// Unschedulable is true for a Pending pod whose PodScheduled condition is False with
	// reason Unschedulable: the scheduler found no node for it.
	Unschedulable bool
	// PendingSince is when it became unschedulable (from the condition's
	// lastTransitionTime, which is to the second); zero means now.
	PendingSince time.Time
	// Finished is true for a pod that Succeeded or Failed: it holds no node.
	Finished bool
	// Daemon is true for a pod of a DaemonSet: it runs on every node, so it neither asks
	// for a node nor keeps one.
	Daemon bool
	// Job is true for a pod owned by a Job (or another run-to-completion owner).
	Job bool
	// Requests are what the scheduler places the pod by (its effective requests).
	Requests Resources
	// Nominated is status.nominatedNodeName: the node the scheduler is to try first.
	Nominated string
	// NoNewNode says why no new node could run the pod whatever its size (its nodeSelector
	// or required node affinity matches no node of the kind this cluster rents); "" when
	// one could, or when that is not known yet.
	NoNewNode string
	// OwnerSettled is true when the pod's controller (a ReplicaSet, Job or StatefulSet)
	// has every pod it wants now and the scheduler has tried each of them: no pod of that
	// controller is on its way.
	OwnerSettled bool
}

// Node is one Node of the tenant cluster.
type Node struct {
	Name string
	// Draining is true for a node cordoned to be consolidated away: once it has no
	// non-daemon pod it is released at once, without waiting for Hold.
	Draining bool
	// ReadySince is when its Ready condition last became True. Until SchedulerSettle after
	// it, the scheduler may not have tried the pending pods on it yet, so its free slots
	// count for them; later they do not. Zero means long ago.
	ReadySince time.Time
}

// Claim is one NodeClaim of the cluster.
type Claim struct {
	// Name of the NodeClaim.
	Name string
	// NodeName is the node the claim provides (spec.nodeName).
	NodeName string
	// Deleting is true once the claim has a deletionTimestamp: its node is on its way out.
	Deleting bool
	// Replaces are the nodes the claim's node was rented to replace: once it has joined,
	// they are drained.
	Replaces []string
}

// Price is what a node costs per hour, in a currency's smallest unit.
type Price struct {
	Cost     int64
	Currency string
}

// Replacement is a set of nodes whose pods fit on the other nodes and one new node, which
// the market is to sell for less than they cost together (Karpenter's consolidation by
// replacement, priced by bids rather than a price list).
type Replacement struct {
	// Nodes are the nodes to replace, sorted: at least two, all priced in one currency.
	Nodes []string
	// Size is the new node's: the smallest that holds what the simulation put on it.
	Size Size
	// MaxPrice is the most the new node may cost: what Nodes cost together, less one.
	MaxPrice Price
}

// key names the set of nodes a replacement is about, for the decision's memory.
func (r Replacement) key() string { return strings.Join(r.Nodes, ",") }

// State is what the decision remembers between two calls: when each node was first seen
// with no non-daemon pod. The caller keeps the Decision's State and passes it back.
type State struct {
	EmptySince map[string]time.Time
	// ConsolidatableSince is when each node was first seen consolidatable
	// (Input.Consolidatable) without a break.
	ConsolidatableSince map[string]time.Time
	// ReplaceableSince is when the set of nodes of Input.Replacement (by key) was first
	// seen replaceable without a break.
	ReplaceableSince map[string]time.Time
	// ReplaceTried is when a replacement of each set of nodes was last rented, kept for
	// ReplaceRetry: a set is not offered again within it.
	ReplaceTried map[string]time.Time
}

// Input is everything one decision looks at.
type Input struct {
	Now    time.Time
	Pods   []Pod
	Nodes  []Node
	Claims []Claim
	// MaxNodes bounds nodes plus claims in flight.
	MaxNodes int
	// NodeSize is what a new node offers pods (its allocatable); zero: not known yet (no
	// node has joined), and every pod may fit.
	NodeSize Resources
	// PodsPerNode is how many non-daemon pods one node is sized for (at least 1).
	PodsPerNode int
	// Hold is how long a node must stay empty before it is released.
	Hold time.Duration
	// BatchIdle and BatchMax override the batching of pending pods; 0 means the default
	// (BatchIdle, BatchMax). A caller that must act sooner (a test) or later sets them.
	BatchIdle, BatchMax time.Duration
	State               State
	// Consolidatable are the nodes, best first, whose pods a simulation places on the other
	// nodes (none being released), which hold no pod that blocks a disruption, and whose
	// Cluster consolidates when underutilized; empty when it consolidates only empty nodes.
	// The pods of all of them together fit on the rest, so any of them may be drained at
	// once.
	Consolidatable []string
	// DisruptionBudget is the most nodes one consolidation drains at once; 0 or less is 1.
	// (A budget that allows none gives no Consolidatable nodes.)
	DisruptionBudget int
	// Replacement is a set of nodes one cheaper new node could replace; nil when none (the
	// Cluster consolidates only empty nodes, its budget allows fewer than two nodes at
	// once, or no set of priced nodes has pods that fit on the rest and one new node).
	Replacement *Replacement
	// Simulated are the facts of a scheduling simulation of the pending pods (the
	// scheduler's own filters run against the nodes, the claims in flight and new nodes of
	// the size on offer); nil when none ran, and the slot counting of Decide decides.
	Simulated *Simulation
}

// Simulation is what a scheduling simulation found for the pending pods (Input.Pods that
// are Unschedulable), by pod name.
type Simulation struct {
	// NewNodes is how many new nodes the pods that fit one need (at most the room
	// maxNodes leaves).
	NewNodes int
	// Unplaced are the pods no node can run, existing or new, with the scheduler's reason
	// ("Insufficient cpu"). A pod a new node could run but for maxNodes is not one of them.
	Unplaced map[string]string
	// OnNodes are the pods that fit a node the cluster has or a claim in flight brings,
	// each with that node: they wait for the scheduler, not for a node.
	OnNodes map[string]string
	// NewNodePods are the pods placed on each new node, one list per node of NewNodes: the
	// pods it is rented for.
	NewNodePods [][]string
	// NewNodeSizes are the sizes of the new nodes, one per node of NewNodes: each the
	// smallest that holds the pods the simulation packed onto it. Missing entries are
	// the smallest size the cluster rents.
	NewNodeSizes []Size
}

// Action is what the decision asks for.
type Action string

const (
	// Provision asks for Decision.Provision more nodes (NodeClaims).
	Provision Action = "Provision"
	// Release asks for the claims of Decision.Release to be deleted.
	Release Action = "Release"
	// Hold asks for nothing now.
	Hold Action = "Hold"
	// Drain asks for the nodes of Decision.Drain to be cordoned and their pods evicted, so
	// that the pods move to the other nodes and they are released, empty.
	Drain Action = "Drain"
)

// Reasons, one per rule that decided.
const (
	ReasonIntentNoNode     = "intent and no node"
	ReasonIntentBeyond     = "intent beyond capacity"
	ReasonBatching         = "batching pending pods"
	ReasonAtMax            = "at maxNodes"
	ReasonCapacity         = "capacity available for pending pods"
	ReasonEmptyPastHold    = "empty past hold"
	ReasonEmptyWithinHold  = "empty within hold"
	ReasonBusy             = "every node busy"
	ReasonNoIntent         = "no intent and no node"
	ReasonInFlight         = "claims in flight"
	ReasonNoNodesAllowed   = "maxNodes is 0"
	ReasonReleaseUnclaimed = "empty nodes have no claim to release"
	// ReasonFitsExisting: the simulation places every pending pod on a node the cluster
	// has or a claim in flight brings.
	ReasonFitsExisting = "pending pods fit existing nodes"
	// ReasonUnderutilized: a node's pods fit on the others, and have since at least Hold.
	ReasonUnderutilized = "underutilized past hold"
	// ReasonUnderutilizedWithinHold: a node's pods fit on the others, for less than Hold.
	ReasonUnderutilizedWithinHold = "underutilized within hold"
	// ReasonDrained: a node drained for consolidation has no non-daemon pod left.
	ReasonDrained = "drained for consolidation"
	// ReasonDraining: a node being drained still runs pods.
	ReasonDraining = "draining for consolidation"
	// ReasonReplaceCheaper: nodes whose pods fit on the rest and one new node have been so
	// for Hold; the new node is rented, capped below what they cost together.
	ReasonReplaceCheaper = "replaceable by one cheaper node past hold"
	// ReasonReplaceWithinHold: such nodes, for less than Hold.
	ReasonReplaceWithinHold = "replaceable by one cheaper node within hold"
	// ReasonReplaceTried: a replacement of the same nodes found no bid under its cap
	// within ReplaceRetry.
	ReasonReplaceTried = "replacement tried recently"
	// ReasonReplaced: a replacement's node has joined; the nodes it replaces are drained.
	ReasonReplaced = "replaced by a cheaper node"
	// ReasonReplacing: a replacement's claim is in flight.
	ReasonReplacing = "a cheaper replacement node in flight"
)

// Decision is the outcome of Decide.
type Decision struct {
	Action Action
	// Provision is how many nodes to add (Action Provision).
	Provision int
	// Sizes are the sizes of the nodes to add, in order, when a simulation sized them
	// (Input.Simulated); a node without an entry is rented at the cluster's smallest size.
	Sizes []Size
	// NewNodePods are the pods the simulation placed on each node to add, in the order of
	// Sizes: nominated to the node once it is claimed, so that the scheduler places them
	// where the simulation did rather than spreading them by its scores.
	NewNodePods [][]string
	// Release are the nodes whose claims to delete (Action Release), sorted.
	Release []string
	// ReleaseClaims are the claims of Release, in the same order.
	ReleaseClaims []string
	// Drain are the nodes to drain (Action Drain), in the order of Input.Consolidatable,
	// or sorted when a replacement's node has joined.
	Drain []string
	// Replaces and MaxPrice are set when the node to add (Action Provision, one node)
	// replaces other nodes: they are drained once it joins, and it may cost at most
	// MaxPrice.
	Replaces []string
	MaxPrice *Price
	Reason   string
	// RequeueAfter is when to decide again without an event (a batch closing, a hold
	// ending); 0 means only on the next event.
	RequeueAfter time.Duration
	// State is what to pass back in the next Input.
	State State
	// Unfittable are the pending pods no new node can run (Input.Simulated, else
	// Input.NodeSize and Pod.NoNewNode), sorted: they ask for no node and block no release,
	// and are reported.
	Unfittable []string
	// UnfittableWhy says, for each pod of Unfittable, why no node can run it.
	UnfittableWhy map[string]string
}

// Decide is the scale decision.
//
//  0. A pending pod the simulation could place nowhere (Input.Simulated.Unplaced) fits
//     nowhere; without a simulation, so does one whose requests exceed what a new node offers
//     (Input.NodeSize, when known) or that no new node could run for another reason
//     (Pod.NoNewNode). It is reported with why (Decision.Unfittable, UnfittableWhy) and is
//     no pending pod below. Renting for it would buy nodes it can never run on, and keep
//     them.
//  1. Pending pods: the non-daemon, unbound, Unschedulable pods. While any exists nothing
//     is released. Their batch closes BatchIdle after the newest one and at most BatchMax
//     after the oldest (Input.BatchIdle and Input.BatchMax override both); before that the decision is Hold (ReasonBatching) with RequeueAfter
//     the closing time. When every pending pod's controller is settled (Pod.OwnerSettled),
//     SettledIdle (or a shorter BatchIdle) replaces BatchIdle: Karpenter waits its idle
//     second because more pods may be coming, and these controllers say none are.
//  2. With a simulation: when every pending pod fits a node the cluster has or a claim in
//     flight brings (Simulated.OnNodes), it waits for the scheduler: Hold
//     (ReasonFitsExisting). Otherwise Simulated.NewNodes are needed, bounded as below.
//     Without one, capacity is PodsPerNode for each claim in flight (not deleting, its node not joined
//     yet) plus the free slots of each node that is not being released and has been Ready
//     for less than SchedulerSettle (PodsPerNode minus its running non-daemon pods; the
//     decision then looks again when that node settles). A node Ready for longer offers
//     nothing: the scheduler has tried the pending pods there and found they do not fit.
//     Pending pods that fit are Hold (ReasonCapacity). The rest need ceil(rest/PodsPerNode)
//     nodes, bounded by MaxNodes minus nodes and claims in flight (deleting ones included:
//     they still exist); 0 left is Hold (ReasonAtMax).
//  3. Without pending pods, a node with a claim, not being released, with no non-daemon pod
//     (a running Job pod is a non-daemon pod) since at least Hold is released; several are
//     released together, the rest stay. A node that became empty more recently is Hold
//     (ReasonEmptyWithinHold) until the earliest hold ends. Before that, the nodes a joined
//     replacement's claim replaces (Claim.Replaces) are drained together (ReasonReplaced),
//     and the replacement is not released while any of them is still there.
//  4. Consolidation, with no claim in flight and no node draining: the Consolidatable nodes
//     past Hold are drained, up to DisruptionBudget. When there are none, a Replacement
//     past Hold (and not tried within ReplaceRetry) rents its one new node, capped at its
//     MaxPrice, when maxNodes leaves room for it.
func Decide(in Input) Decision {
	perNode := in.PodsPerNode
	if perNode < 1 {
		perNode = 1
	}
	claimOf := map[string]Claim{}
	for _, c := range in.Claims {
		if c.NodeName != "" {
			claimOf[c.NodeName] = c
		}
	}
	joined := map[string]bool{}
	for _, n := range in.Nodes {
		joined[n.Name] = true
	}
	busy := map[string]int{}
	var pending []Pod
	var unfittable []string
	why := map[string]string{}
	for _, p := range in.Pods {
		switch {
		case p.Finished || p.Daemon:
		case p.Node != "":
			busy[p.Node]++
		case !p.Unschedulable:
		case in.Simulated != nil:
			if reason, ok := in.Simulated.Unplaced[p.Name]; ok {
				unfittable, why[p.Name] = append(unfittable, p.Name), reason
			} else {
				pending = append(pending, p)
			}
		case p.NoNewNode != "":
			unfittable, why[p.Name] = append(unfittable, p.Name), p.NoNewNode
		case in.NodeSize.known() && !p.Requests.fitsIn(in.NodeSize):
			unfittable = append(unfittable, p.Name)
			why[p.Name] = fmt.Sprintf("requests %dm CPU and %d MiB, more than a node offers (%dm CPU and %d MiB)",
				p.Requests.MilliCPU, p.Requests.MemBytes>>20, in.NodeSize.MilliCPU, in.NodeSize.MemBytes>>20)
		default:
			pending = append(pending, p)
		}
	}
	sort.Strings(unfittable)
	if len(why) == 0 {
		why = nil
	}

	// Emptiness carried over: a node keeps its first empty time while it stays empty.
	st := State{EmptySince: map[string]time.Time{}}
	for _, name := range in.Consolidatable {
		since, ok := in.State.ConsolidatableSince[name]
		if !ok || since.After(in.Now) {
			since = in.Now
		}
		if st.ConsolidatableSince == nil {
			st.ConsolidatableSince = map[string]time.Time{}
		}
		st.ConsolidatableSince[name] = since
	}
	for _, n := range in.Nodes {
		if busy[n.Name] > 0 {
			continue
		}
		since, ok := in.State.EmptySince[n.Name]
		if !ok || since.After(in.Now) {
			since = in.Now
		}
		st.EmptySince[n.Name] = since
	}
	for key, at := range in.State.ReplaceTried {
		if in.Now.Sub(at) < ReplaceRetry {
			if st.ReplaceTried == nil {
				st.ReplaceTried = map[string]time.Time{}
			}
			st.ReplaceTried[key] = at
		}
	}
	d := Decision{Action: Hold, State: st, Unfittable: unfittable, UnfittableWhy: why}

	inFlight, total, replacing := 0, len(in.Nodes), false
	for _, c := range in.Claims {
		if !joined[c.NodeName] {
			total++
			if !c.Deleting {
				inFlight++
				replacing = replacing || len(c.Replaces) > 0
			}
		}
	}

	if len(pending) > 0 {
		first, last := in.Now, time.Time{}
		for _, p := range pending {
			at := p.PendingSince
			if at.IsZero() || at.After(in.Now) {
				at = in.Now
			}
			if at.Before(first) {
				first = at
			}
			if at.After(last) {
				last = at
			}
		}
		idle, most := in.BatchIdle, in.BatchMax
		if idle <= 0 {
			idle = BatchIdle
		}
		if settled(pending) {
			idle = min(idle, SettledIdle)
		}
		if most <= 0 {
			most = BatchMax
		}
		closes := last.Add(idle)
		if m := first.Add(most); m.Before(closes) {
			closes = m
		}
		if in.Now.Before(closes) {
			d.Reason, d.RequeueAfter = ReasonBatching, closes.Sub(in.Now)
			return d
		}
		var need int
		if sim := in.Simulated; sim != nil {
			waiting := 0
			for _, p := range pending {
				if _, fits := sim.OnNodes[p.Name]; fits {
					waiting++
				}
			}
			if waiting == len(pending) {
				d.Reason = ReasonFitsExisting
				return d
			}
			need = sim.NewNodes
		} else {
			var settles time.Duration
			need, settles = slotsNeeded(in, pending, perNode, inFlight, claimOf, busy)
			if need <= 0 {
				d.Reason, d.RequeueAfter = ReasonCapacity, settles
				return d
			}
		}
		room := in.MaxNodes - total
		if need > room {
			need = room
		}
		if need <= 0 {
			d.Reason = ReasonAtMax
			if in.MaxNodes <= 0 {
				d.Reason = ReasonNoNodesAllowed
			}
			return d
		}
		d.Action, d.Provision = Provision, need
		if in.Simulated != nil {
			d.Sizes = in.Simulated.NewNodeSizes[:min(need, len(in.Simulated.NewNodeSizes))]
			d.NewNodePods = in.Simulated.NewNodePods[:min(need, len(in.Simulated.NewNodePods))]
		}
		d.Reason = ReasonIntentBeyond
		if total == 0 {
			d.Reason = ReasonIntentNoNode
		}
		return d
	}

	var soonest time.Duration
	unclaimed := false
	draining := map[string]bool{}
	for _, n := range in.Nodes {
		draining[n.Name] = n.Draining
	}
	// A replacement whose node has joined: the nodes it replaces are drained together, and
	// until they are gone it is kept however long it stays empty (their pods are on their
	// way to it).
	kept := map[string]bool{}
	for _, c := range in.Claims {
		if c.Deleting || !joined[c.NodeName] {
			continue
		}
		for _, name := range c.Replaces {
			rc, claimed := claimOf[name]
			if !joined[name] || !claimed || rc.Deleting {
				continue
			}
			kept[c.NodeName] = true
			if !draining[name] && !slices.Contains(d.Drain, name) {
				d.Drain = append(d.Drain, name)
			}
		}
	}
	if len(d.Drain) > 0 {
		sort.Strings(d.Drain)
		d.Action, d.Reason = Drain, ReasonReplaced
		return d
	}
	for _, n := range in.Nodes {
		since, empty := st.EmptySince[n.Name]
		if !empty || kept[n.Name] {
			continue
		}
		c, ok := claimOf[n.Name]
		if !ok {
			unclaimed = true
			continue
		}
		if c.Deleting {
			continue
		}
		if left := since.Add(in.Hold).Sub(in.Now); left > 0 && !n.Draining {
			if soonest == 0 || left < soonest {
				soonest = left
			}
			continue
		}
		d.Release = append(d.Release, n.Name)
	}
	if len(d.Release) > 0 {
		sort.Strings(d.Release)
		drained := true
		for _, n := range d.Release {
			d.ReleaseClaims = append(d.ReleaseClaims, claimOf[n].Name)
			drained = drained && draining[n]
		}
		d.Action, d.Reason = Release, ReasonEmptyPastHold
		if drained {
			d.Reason = ReasonDrained
		}
		d.RequeueAfter = soonest
		return d
	}
	// Consolidation, up to DisruptionBudget nodes at once: none while a node is draining or
	// a claim is in flight (the simulation counted neither).
	drainingNow := false
	for _, n := range in.Nodes {
		if c, ok := claimOf[n.Name]; ok && n.Draining && !c.Deleting {
			drainingNow = true
		}
	}
	underused := false
	if !drainingNow && inFlight == 0 {
		budget := max(in.DisruptionBudget, 1)
		for _, name := range in.Consolidatable {
			c, ok := claimOf[name]
			if !ok || c.Deleting || draining[name] {
				continue
			}
			left := st.ConsolidatableSince[name].Add(in.Hold).Sub(in.Now)
			if left <= 0 {
				if len(d.Drain) < budget {
					d.Drain = append(d.Drain, name)
				}
				continue
			}
			if soonest == 0 || left < soonest {
				soonest, underused = left, true
			}
		}
		if len(d.Drain) > 0 {
			d.Action, d.Reason = Drain, ReasonUnderutilized
			d.RequeueAfter = soonest
			return d
		}
		if r := in.Replacement; r != nil && len(in.Consolidatable) == 0 && in.MaxNodes-total > 0 {
			key := r.key()
			since, ok := in.State.ReplaceableSince[key]
			if !ok || since.After(in.Now) {
				since = in.Now
			}
			d.State.ReplaceableSince = map[string]time.Time{key: since}
			retry := time.Duration(0)
			if at, tried := d.State.ReplaceTried[key]; tried {
				retry = at.Add(ReplaceRetry).Sub(in.Now)
			}
			switch left := since.Add(in.Hold).Sub(in.Now); {
			case retry > 0:
				d.Reason, d.RequeueAfter = ReasonReplaceTried, retry
				if soonest > 0 && soonest < retry {
					d.RequeueAfter = soonest
				}
				return d
			case left > 0:
				d.Reason, d.RequeueAfter = ReasonReplaceWithinHold, left
				if soonest > 0 && soonest < left {
					d.RequeueAfter = soonest
				}
				return d
			}
			if d.State.ReplaceTried == nil {
				d.State.ReplaceTried = map[string]time.Time{}
			}
			d.State.ReplaceTried[key] = in.Now
			price := r.MaxPrice
			d.Action, d.Provision, d.Sizes = Provision, 1, []Size{r.Size}
			d.Replaces, d.MaxPrice = slices.Clone(r.Nodes), &price
			d.Reason, d.RequeueAfter = ReasonReplaceCheaper, soonest
			return d
		}
	}
	switch {
	case drainingNow:
		d.Reason, d.RequeueAfter = ReasonDraining, DrainRetry
		if soonest > 0 && soonest < DrainRetry {
			d.RequeueAfter = soonest
		}
	case soonest > 0 && underused:
		d.Reason, d.RequeueAfter = ReasonUnderutilizedWithinHold, soonest
	case soonest > 0:
		d.Reason, d.RequeueAfter = ReasonEmptyWithinHold, soonest
	case replacing:
		d.Reason = ReasonReplacing
	case inFlight > 0:
		d.Reason = ReasonInFlight
	case unclaimed:
		d.Reason = ReasonReleaseUnclaimed
	case len(in.Nodes) == 0:
		d.Reason = ReasonNoIntent
	default:
		d.Reason = ReasonBusy
	}
	return d
}

// slotsNeeded is how many nodes the pending pods need by counting slots (rule 2 of
// Decide), 0 when the capacity holds them, and when the first young node settles.
func slotsNeeded(in Input, pending []Pod, perNode, inFlight int, claimOf map[string]Claim, busy map[string]int) (int, time.Duration) {
	free := inFlight * perNode
	var settles time.Duration
	for _, n := range in.Nodes {
		if c, ok := claimOf[n.Name]; ok && c.Deleting {
			continue
		}
		left := n.ReadySince.Add(SchedulerSettle).Sub(in.Now)
		if n.ReadySince.IsZero() || left <= 0 {
			continue
		}
		if f := perNode - busy[n.Name]; f > 0 {
			free += f
			if settles == 0 || left < settles {
				settles = left
			}
		}
	}
	rest := len(pending) - free
	if rest <= 0 {
		return 0, settles
	}
	return (rest + perNode - 1) / perNode, settles
}

// settled says whether every pod's controller has all its pods and none on its way.
func settled(pods []Pod) bool {
	for _, p := range pods {
		if !p.OwnerSettled {
			return false
		}
	}
	return len(pods) > 0
}
