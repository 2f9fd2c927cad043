package scale

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func pending(name string, ago time.Duration) Pod {
	return Pod{Name: name, Unschedulable: true, PendingSince: t0.Add(-ago)}
}

// decideCase is a row of a Decide table: the decision's State is not compared (rows that
// check it do so on their own).
type decideCase struct {
	name string
	in   Input
	want Decision
}

// checkDecide runs Decide on each row.
func checkDecide(t *testing.T, cases []decideCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Decide(tc.in)
			got.State = State{}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	hold := 2 * time.Minute
	cases := []decideCase{
		{
			name: "nothing at all",
			in:   Input{Now: t0, MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonNoIntent},
		},
		{
			name: "one pending pod within the idle window waits for the batch",
			in:   Input{Now: t0, Pods: []Pod{pending("a", 300*time.Millisecond)}, MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 700 * time.Millisecond},
		},
		{
			name: "pending pods keep coming: the batch closes 10 s after the first",
			in: Input{Now: t0, Pods: []Pod{pending("a", 9500*time.Millisecond), pending("b", 100*time.Millisecond)},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 500 * time.Millisecond},
		},
		{
			name: "batch closed at the 10 s bound although a pod is newer than 1 s",
			in: Input{Now: t0, Pods: []Pod{pending("a", 10*time.Second), pending("b", 100*time.Millisecond)},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "every pending pod's controller settled: the batch closes SettledIdle after the newest",
			in: Input{Now: t0, Pods: []Pod{settledPod(pending("a", 2*time.Second)), settledPod(pending("b", 300*time.Millisecond))},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "settled, but the newest pod is younger than SettledIdle",
			in: Input{Now: t0, Pods: []Pod{settledPod(pending("a", 2*time.Second)), settledPod(pending("b", 100*time.Millisecond))},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 150 * time.Millisecond},
		},
		{
			name: "one pending pod's controller not settled: the idle second holds for all",
			in: Input{Now: t0, Pods: []Pod{settledPod(pending("a", 2*time.Second)), pending("b", 300*time.Millisecond)},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 700 * time.Millisecond},
		},
		{
			name: "settled, and a shorter BatchIdle still applies",
			in: Input{Now: t0, Pods: []Pod{settledPod(pending("a", 100*time.Millisecond))}, MaxNodes: 3, PodsPerNode: 2, Hold: hold,
				BatchIdle: 50 * time.Millisecond},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "a longer BatchIdle keeps the batch open",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second)}, MaxNodes: 3, PodsPerNode: 2, Hold: hold,
				BatchIdle: 5 * time.Second},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 3 * time.Second},
		},
		{
			name: "a shorter BatchMax closes the batch sooner",
			in: Input{Now: t0, Pods: []Pod{pending("a", 3*time.Second), pending("b", 100*time.Millisecond)},
				MaxNodes: 3, PodsPerNode: 2, Hold: hold, BatchMax: 3 * time.Second},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "intent and no node: three pods, one per node, three nodes",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 3, Reason: ReasonIntentNoNode},
		},
		{
			name: "bounded by maxNodes",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				MaxNodes: 2, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 2, Reason: ReasonIntentNoNode},
		},
		{
			name: "a claim in flight covers the pending pods",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second)},
				Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonCapacity},
		},
		{
			name: "claims in flight count against maxNodes",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 2, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
		{
			name: "a deleting claim counts against maxNodes but offers no capacity",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second)},
				Claims: []Claim{{Name: "c1", NodeName: "n1", Deleting: true}}, MaxNodes: 1, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonAtMax},
		},
		{
			name: "maxNodes 0",
			in:   Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second)}, MaxNodes: 0, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonNoNodesAllowed},
		},
		{
			name: "a free slot on a node Ready for 2 s may still take the pending pod: look again when it settles",
			in: Input{Now: t0, Pods: []Pod{{Name: "r", Node: "n1"}, pending("a", 2*time.Second)},
				Nodes: []Node{{Name: "n1", ReadySince: t0.Add(-2 * time.Second)}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 2, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonCapacity, RequeueAfter: 3 * time.Second},
		},
		{
			// The scheduler said no (memory, anti-affinity, a port): its free slots are not
			// the pod's.
			name: "a free slot on a settled node does not take a pod the scheduler refused: one more",
			in: Input{Now: t0, Pods: []Pod{{Name: "r", Node: "n1"}, pending("a", 2*time.Second), pending("b", 2*time.Second)},
				Nodes: []Node{{Name: "n1", ReadySince: t0.Add(-time.Minute)}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 40, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
		{
			name: "a node with no Ready time counts as settled",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 40, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
		{
			name: "a full node: one more",
			in: Input{Now: t0, Pods: []Pod{{Name: "r", Node: "n1"}, {Name: "d", Node: "n1", Daemon: true}, pending("a", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
		{
			name: "a pending daemon pod asks for no node",
			in:   Input{Now: t0, Pods: []Pod{{Name: "d", Unschedulable: true, Daemon: true, PendingSince: t0.Add(-time.Minute)}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonNoIntent},
		},
		{
			name: "a node empty past the hold is released, a busy one stays",
			in: Input{Now: t0, Pods: []Pod{{Name: "r", Node: "n2"}, {Name: "d", Node: "n1", Daemon: true}, {Name: "done", Node: "n1", Finished: true}},
				Nodes: []Node{{Name: "n1"}, {Name: "n2"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}, {Name: "c2", NodeName: "n2"}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-3 * time.Minute)}}},
			want: Decision{Action: Release, Release: []string{"n1"}, ReleaseClaims: []string{"c1"}, Reason: ReasonEmptyPastHold},
		},
		{
			name: "a node just emptied waits out the hold",
			in: Input{Now: t0, Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-30 * time.Second)}}},
			want: Decision{Action: Hold, Reason: ReasonEmptyWithinHold, RequeueAfter: 90 * time.Second},
		},
		{
			name: "a node seen empty for the first time starts its hold now",
			in:   Input{Now: t0, Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonEmptyWithinHold, RequeueAfter: hold},
		},
		{
			name: "a running job pod keeps its node",
			in: Input{Now: t0, Pods: []Pod{{Name: "j", Node: "n1", Job: true}}, Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}}},
			want: Decision{Action: Hold, Reason: ReasonBusy},
		},
		{
			name: "pending pods block a release",
			in: Input{Now: t0, Pods: []Pod{{Name: "r", Node: "n2"}, pending("a", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}, {Name: "n2"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}, {Name: "c2", NodeName: "n2"}},
				MaxNodes: 2, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}}},
			want: Decision{Action: Hold, Reason: ReasonAtMax},
		},
		{
			name: "a node being released is not released again",
			in: Input{Now: t0, Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1", Deleting: true}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}}},
			want: Decision{Action: Hold, Reason: ReasonBusy},
		},
		{
			name: "an empty node without a claim cannot be released",
			in:   Input{Now: t0, Nodes: []Node{{Name: "byhand"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"byhand": t0.Add(-time.Hour)}}},
			want: Decision{Action: Hold, Reason: ReasonReleaseUnclaimed},
		},
		{
			// A 64-CPU pod on a market of 1-CPU nodes: renting would buy nodes it never runs on.
			name: "a pod larger than a new node fits nowhere: reported, no node rented",
			in: Input{Now: t0, Pods: []Pod{{Name: "big", Unschedulable: true, PendingSince: t0.Add(-time.Minute), Requests: Resources{MilliCPU: 64000}}},
				NodeSize: Resources{MilliCPU: 1000, MemBytes: 256 << 20}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonNoIntent, Unfittable: []string{"big"},
				UnfittableWhy: map[string]string{"big": "requests 64000m CPU and 0 MiB, more than a node offers (1000m CPU and 256 MiB)"}},
		},
		{
			name: "a pod that fits nowhere blocks no release, and one that fits still gets a node",
			in: Input{Now: t0, Pods: []Pod{{Name: "big", Unschedulable: true, PendingSince: t0.Add(-time.Minute), Requests: Resources{MemBytes: 1 << 30}}},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, NodeSize: Resources{MilliCPU: 1000, MemBytes: 256 << 20},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}}},
			want: Decision{Action: Release, Release: []string{"n1"}, ReleaseClaims: []string{"c1"}, Reason: ReasonEmptyPastHold, Unfittable: []string{"big"},
				UnfittableWhy: map[string]string{"big": "requests 0m CPU and 1024 MiB, more than a node offers (1000m CPU and 256 MiB)"}},
		},
		{
			name: "requests equal to a new node's size fit it",
			in: Input{Now: t0, Pods: []Pod{
				{Name: "exact", Unschedulable: true, PendingSince: t0.Add(-time.Minute), Requests: Resources{MilliCPU: 1000, MemBytes: 256 << 20}},
				{Name: "big", Unschedulable: true, PendingSince: t0.Add(-time.Minute), Requests: Resources{MilliCPU: 1001}}},
				NodeSize: Resources{MilliCPU: 1000, MemBytes: 256 << 20}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode, Unfittable: []string{"big"},
				UnfittableWhy: map[string]string{"big": "requests 1001m CPU and 0 MiB, more than a node offers (1000m CPU and 256 MiB)"}},
		},
		{
			name: "a pod whose node selector no new node matches fits nowhere, whatever its size",
			in: Input{Now: t0, Pods: []Pod{{Name: "gpu", Unschedulable: true, PendingSince: t0.Add(-time.Minute), NoNewNode: "node selector"}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonNoIntent, Unfittable: []string{"gpu"}, UnfittableWhy: map[string]string{"gpu": "node selector"}},
		},
		{
			name: "the node size not known yet (no node joined): a big pod asks for one",
			in: Input{Now: t0, Pods: []Pod{{Name: "big", Unschedulable: true, PendingSince: t0.Add(-time.Minute), Requests: Resources{MilliCPU: 64000}}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "a claim in flight and no pods: hold",
			in:   Input{Now: t0, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold},
			want: Decision{Action: Hold, Reason: ReasonInFlight},
		},
		// With a simulation, its facts decide what slots and sizes did.
		{
			name: "simulated: three pods a node each (anti-affinity) rent three although podsPerNode holds them in one",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				MaxNodes: 5, PodsPerNode: 10, Hold: hold, Simulated: &Simulation{NewNodes: 3}},
			want: Decision{Action: Provision, Provision: 3, Reason: ReasonIntentNoNode},
		},
		{
			name: "simulated: new nodes bounded by maxNodes less nodes and claims",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}}, MaxNodes: 2, PodsPerNode: 1, Hold: hold, Simulated: &Simulation{NewNodes: 3}},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
		{
			name: "simulated: the sizes of the nodes that fit within maxNodes go with them, in order",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold,
				Simulated: &Simulation{NewNodes: 3, NewNodeSizes: []Size{{2, 1024}, {1, 512}, {1, 256}}}},
			want: Decision{Action: Provision, Provision: 2, Sizes: []Size{{2, 1024}, {1, 512}}, Reason: ReasonIntentBeyond},
		},
		{
			name: "simulated: the provision count is the simulation's (three pods that share a new node rent one)",
			in: Input{Now: t0, Pods: []Pod{pending("a", 2*time.Second), pending("b", 2*time.Second), pending("c", 2*time.Second)},
				MaxNodes: 5, PodsPerNode: 1, Hold: hold, Simulated: &Simulation{NewNodes: 1}},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentNoNode},
		},
		{
			name: "simulated: still batching",
			in: Input{Now: t0, Pods: []Pod{pending("a", 300*time.Millisecond)}, MaxNodes: 3, PodsPerNode: 1, Hold: hold,
				Simulated: &Simulation{NewNodes: 1}},
			want: Decision{Action: Hold, Reason: ReasonBatching, RequeueAfter: 700 * time.Millisecond},
		},
		{
			name: "simulated: a pod no node can run is reported with its reason and blocks neither the others' node nor a release",
			in: Input{Now: t0, Pods: []Pod{pending("big", time.Minute), pending("a", 2*time.Second)},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold,
				Simulated: &Simulation{NewNodes: 1, Unplaced: map[string]string{"big": "Insufficient cpu"}}},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond, Unfittable: []string{"big"},
				UnfittableWhy: map[string]string{"big": "Insufficient cpu"}},
		},
		{
			name: "simulated: only a pod no node can run pending: the empty node past its hold is released",
			in: Input{Now: t0, Pods: []Pod{pending("big", time.Minute)},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold,
				State:     State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}},
				Simulated: &Simulation{Unplaced: map[string]string{"big": "Insufficient cpu"}}},
			want: Decision{Action: Release, Release: []string{"n1"}, ReleaseClaims: []string{"c1"}, Reason: ReasonEmptyPastHold,
				Unfittable: []string{"big"}, UnfittableWhy: map[string]string{"big": "Insufficient cpu"}},
		},
		{
			name: "simulated: a pod that fits a settled node waits for the scheduler and rents nothing",
			in: Input{Now: t0, Pods: []Pod{pending("a", time.Minute)},
				Nodes: []Node{{Name: "n1", ReadySince: t0.Add(-time.Hour)}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}},
				MaxNodes: 3, PodsPerNode: 1, Hold: hold, Simulated: &Simulation{OnNodes: map[string]string{"a": "n1"}}},
			want: Decision{Action: Hold, Reason: ReasonFitsExisting},
		},
		{
			name: "simulated: a pod that fits an existing node blocks the release of an empty one",
			in: Input{Now: t0, Pods: []Pod{pending("a", time.Minute)},
				Nodes: []Node{{Name: "n1"}}, Claims: []Claim{{Name: "c1", NodeName: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold,
				State:     State{EmptySince: map[string]time.Time{"n1": t0.Add(-time.Hour)}},
				Simulated: &Simulation{OnNodes: map[string]string{"a": "n1"}}},
			want: Decision{Action: Hold, Reason: ReasonFitsExisting},
		},
		{
			name: "simulated: pods a new node could run but maxNodes leaves no room",
			in: Input{Now: t0, Pods: []Pod{pending("a", time.Minute), pending("b", time.Minute)},
				Nodes: []Node{{Name: "n1"}}, MaxNodes: 1, PodsPerNode: 1, Hold: hold, Simulated: &Simulation{OnNodes: map[string]string{"a": "n1"}}},
			want: Decision{Action: Hold, Reason: ReasonAtMax},
		},
		{
			name: "simulated: the node size and node selector heuristics step aside",
			in: Input{Now: t0, Pods: []Pod{{Name: "gpu", Unschedulable: true, PendingSince: t0.Add(-time.Minute), NoNewNode: "node selector",
				Requests: Resources{MilliCPU: 64000}}}, NodeSize: Resources{MilliCPU: 1000},
				Nodes: []Node{{Name: "n1"}}, MaxNodes: 3, PodsPerNode: 1, Hold: hold, Simulated: &Simulation{NewNodes: 1}},
			want: Decision{Action: Provision, Provision: 1, Reason: ReasonIntentBeyond},
		},
	}
	checkDecide(t, cases)
}

// Consolidation: a node whose pods fit on the others (Input.Consolidatable, from the
// simulation) is drained once it has been so for Hold, one node at a time, and released as
// soon as it is empty.
func TestDecideConsolidation(t *testing.T) {
	hold := time.Minute
	nodes := []Node{{Name: "n1"}, {Name: "n2"}}
	claims := []Claim{{Name: "c1", NodeName: "n1"}, {Name: "c2", NodeName: "n2"}}
	busy := []Pod{{Name: "a", Node: "n1"}, {Name: "b", Node: "n2"}}
	long := State{ConsolidatableSince: map[string]time.Time{"n2": t0.Add(-time.Hour)}}
	cases := []decideCase{{
		name: "consolidatable past hold: drain it",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Consolidatable: []string{"n2"}, State: long},
		want: Decision{Action: Drain, Drain: []string{"n2"}, Reason: ReasonUnderutilized},
	}, {
		name: "the first consolidatable past hold, in the order given",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Consolidatable: []string{"n1", "n2"},
			State: State{ConsolidatableSince: map[string]time.Time{"n1": t0.Add(-time.Hour), "n2": t0.Add(-time.Hour)}}},
		want: Decision{Action: Drain, Drain: []string{"n1"}, Reason: ReasonUnderutilized},
	}, {
		name: "a budget of two drains the first two past hold together",
		in: Input{Now: t0, Pods: busy, Nodes: append(slices.Clone(nodes), Node{Name: "n3"}), Claims: append(slices.Clone(claims), Claim{Name: "c3", NodeName: "n3"}),
			MaxNodes: 3, Hold: hold, Consolidatable: []string{"n3", "n1", "n2"}, DisruptionBudget: 2,
			State: State{ConsolidatableSince: map[string]time.Time{"n1": t0.Add(-time.Hour), "n2": t0.Add(-time.Hour), "n3": t0}}},
		want: Decision{Action: Drain, Drain: []string{"n1", "n2"}, Reason: ReasonUnderutilized, RequeueAfter: hold},
	}, {
		name: "a budget above the candidates drains them all",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Consolidatable: []string{"n2", "n1"}, DisruptionBudget: 5,
			State: State{ConsolidatableSince: map[string]time.Time{"n1": t0.Add(-time.Hour), "n2": t0.Add(-time.Hour)}}},
		want: Decision{Action: Drain, Drain: []string{"n2", "n1"}, Reason: ReasonUnderutilized},
	}, {
		name: "consolidatable for less than hold: wait",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Consolidatable: []string{"n2"}},
		want: Decision{Action: Hold, Reason: ReasonUnderutilizedWithinHold, RequeueAfter: hold},
	}, {
		name: "a node without a claim is never drained",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims[:1], MaxNodes: 3, Hold: hold, Consolidatable: []string{"n2"}, State: long},
		want: Decision{Action: Hold, Reason: ReasonBusy},
	}, {
		name: "a claim in flight: no consolidation",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: append(claims, Claim{Name: "c3", NodeName: "n3"}), MaxNodes: 3, Hold: hold,
			Consolidatable: []string{"n2"}, State: long},
		want: Decision{Action: Hold, Reason: ReasonInFlight},
	}, {
		name: "one at a time: while a node drains no other is drained",
		in: Input{Now: t0, Pods: busy, Nodes: []Node{{Name: "n1", Draining: true}, {Name: "n2"}}, Claims: claims, MaxNodes: 3, Hold: hold,
			Consolidatable: []string{"n2"}, State: long},
		want: Decision{Action: Hold, Reason: ReasonDraining, RequeueAfter: DrainRetry},
	}, {
		name: "a drained node is released at once, within its hold",
		in:   Input{Now: t0, Pods: busy[1:], Nodes: []Node{{Name: "n1", Draining: true}, {Name: "n2"}}, Claims: claims, MaxNodes: 3, Hold: hold},
		want: Decision{Action: Release, Release: []string{"n1"}, ReleaseClaims: []string{"c1"}, Reason: ReasonDrained},
	}, {
		name: "pending pods: no consolidation",
		in: Input{Now: t0, Pods: append(busy, pending("p", 2*time.Second)), Nodes: nodes, Claims: claims, MaxNodes: 2, Hold: hold,
			Consolidatable: []string{"n2"}, State: long},
		want: Decision{Action: Hold, Reason: ReasonAtMax},
	}}
	checkDecide(t, cases)
	// The time a node was first seen consolidatable is kept while it stays so, and dropped
	// when it is not.
	got := Decide(Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Consolidatable: []string{"n1"},
		State: State{ConsolidatableSince: map[string]time.Time{"n1": t0.Add(-time.Second), "n2": t0.Add(-time.Hour)}}}).State.ConsolidatableSince
	if diff := cmp.Diff(map[string]time.Time{"n1": t0.Add(-time.Second)}, got); diff != "" {
		t.Errorf("ConsolidatableSince (-want +got):\n%s", diff)
	}
}

func TestDecideKeepsEmptySince(t *testing.T) {
	in := Input{Now: t0, Nodes: []Node{{Name: "n1"}, {Name: "n2"}}, Pods: []Pod{{Name: "r", Node: "n2"}},
		Claims: []Claim{{Name: "c1", NodeName: "n1"}, {Name: "c2", NodeName: "n2"}}, MaxNodes: 2, PodsPerNode: 1, Hold: time.Minute,
		State: State{EmptySince: map[string]time.Time{"n1": t0.Add(-10 * time.Second), "n2": t0.Add(-time.Hour), "gone": t0}}}
	got := Decide(in).State.EmptySince
	want := map[string]time.Time{"n1": t0.Add(-10 * time.Second)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("EmptySince (-want +got):\n%s", diff)
	}
}

// randomInput draws a cluster: up to 6 nodes (some claimed, some of those deleting), claims
// in flight, pods of every sort on nodes or pending, and a remembered empty time per node.
func randomInput(r *rand.Rand) Input {
	in := Input{Now: t0, MaxNodes: r.Intn(7), PodsPerNode: 1 + r.Intn(4), Hold: time.Duration(r.Intn(180)) * time.Second,
		State: State{EmptySince: map[string]time.Time{}}}
	for i := 0; i < r.Intn(7); i++ {
		n := fmt.Sprintf("n%d", i)
		node := Node{Name: n}
		if r.Intn(3) > 0 { // Ready some time in the last 10 s, so settled or not
			node.ReadySince = t0.Add(-time.Duration(r.Intn(10000)) * time.Millisecond)
		}
		in.Nodes = append(in.Nodes, node)
		if r.Intn(5) > 0 {
			in.Claims = append(in.Claims, Claim{Name: "c-" + n, NodeName: n, Deleting: r.Intn(6) == 0})
		}
		if r.Intn(2) == 0 {
			in.State.EmptySince[n] = t0.Add(-time.Duration(r.Intn(400)) * time.Second)
		}
	}
	if r.Intn(2) == 0 { // a node size known: some pods fit no new node
		in.NodeSize = Resources{MilliCPU: 1000, MemBytes: 256 << 20}
	}
	for i := 0; i < r.Intn(4); i++ {
		in.Claims = append(in.Claims, Claim{Name: fmt.Sprintf("f%d", i), NodeName: fmt.Sprintf("f%d", i), Deleting: r.Intn(5) == 0})
	}
	for i := 0; i < r.Intn(12); i++ {
		p := Pod{Name: fmt.Sprintf("p%d", i), Daemon: r.Intn(5) == 0, Job: r.Intn(3) == 0, Finished: r.Intn(6) == 0,
			Requests: Resources{MilliCPU: int64(r.Intn(1500)), MemBytes: int64(r.Intn(400)) << 20}}
		if r.Intn(8) == 0 {
			p.NoNewNode = "node selector"
		}
		if len(in.Nodes) > 0 && r.Intn(2) == 0 {
			p.Node = in.Nodes[r.Intn(len(in.Nodes))].Name
		} else {
			p.Unschedulable = r.Intn(4) > 0
			p.PendingSince = t0.Add(-time.Duration(r.Intn(15000)) * time.Millisecond)
		}
		in.Pods = append(in.Pods, p)
	}
	return in
}

// TestDecideProperties checks, over many random clusters, the rules no decision may break.
func TestDecideProperties(t *testing.T) {
	r := rand.New(rand.NewSource(31))
	counts := map[Action]int{}
	for i := 0; i < 20000; i++ {
		in := randomInput(r)
		d := Decide(in)
		counts[d.Action]++
		fail := func(format string, a ...any) {
			t.Helper()
			t.Fatalf("case %d: %s\ninput: %+v\ndecision: %+v", i, fmt.Sprintf(format, a...), in, d)
		}
		joined := map[string]bool{}
		for _, n := range in.Nodes {
			joined[n.Name] = true
		}
		total, freeSlots, pendingPods := len(in.Nodes), 0, 0
		for _, c := range in.Claims {
			if !joined[c.NodeName] {
				total++
				if !c.Deleting {
					freeSlots += in.PodsPerNode
				}
			}
		}
		busy := map[string]int{}
		jobOn := map[string]bool{}
		for _, p := range in.Pods {
			if p.Finished || p.Daemon {
				continue
			}
			if p.Node != "" {
				busy[p.Node]++
				jobOn[p.Node] = jobOn[p.Node] || p.Job
			} else if p.Unschedulable && (p.NoNewNode != "" || in.NodeSize.known() && !p.Requests.fitsIn(in.NodeSize)) {
				if !slices.Contains(d.Unfittable, p.Name) {
					fail("%s fits no node of %+v but is not reported", p.Name, in.NodeSize)
				}
			} else if p.Unschedulable {
				pendingPods++
				if slices.Contains(d.Unfittable, p.Name) {
					fail("%s fits a new node but is reported unfittable", p.Name)
				}
			}
		}
		claimOf := map[string]Claim{}
		for _, c := range in.Claims {
			claimOf[c.NodeName] = c
		}
		for _, n := range in.Nodes {
			if c, ok := claimOf[n.Name]; ok && c.Deleting {
				continue
			}
			if n.ReadySince.IsZero() || !in.Now.Before(n.ReadySince.Add(SchedulerSettle)) {
				continue // settled: the scheduler has tried it
			}
			if f := in.PodsPerNode - busy[n.Name]; f > 0 {
				freeSlots += f
			}
		}
		switch d.Action {
		case Provision:
			if d.Provision <= 0 {
				fail("provision of %d", d.Provision)
			}
			if total+d.Provision > in.MaxNodes {
				fail("above maxNodes: %d existing + %d > %d", total, d.Provision, in.MaxNodes)
			}
			if pendingPods <= freeSlots {
				fail("provision although %d pending pods fit %d free slots", pendingPods, freeSlots)
			}
			if (d.Provision-1)*in.PodsPerNode >= pendingPods-freeSlots {
				fail("provisions more nodes than the pending pods need")
			}
			if len(d.Release) > 0 {
				fail("provision and release together")
			}
		case Release:
			if pendingPods > 0 {
				fail("release with %d pending pods", pendingPods)
			}
			if len(d.Release) == 0 || len(d.Release) != len(d.ReleaseClaims) {
				fail("release of nothing")
			}
			for i, n := range d.Release {
				if busy[n] > 0 {
					fail("releases %s with %d non-daemon pods", n, busy[n])
				}
				if jobOn[n] {
					fail("releases %s with a running job pod", n)
				}
				c, ok := claimOf[n]
				if !ok || c.Deleting || c.Name != d.ReleaseClaims[i] {
					fail("releases %s through claim %q", n, d.ReleaseClaims[i])
				}
				since, ok := d.State.EmptySince[n]
				if prev, had := in.State.EmptySince[n]; had && prev.Before(since) {
					fail("forgot that %s was empty since %s", n, prev)
				}
				if !ok || in.Now.Sub(since) < in.Hold {
					fail("releases %s before its hold", n)
				}
			}
		case Hold:
			if d.Provision != 0 || len(d.Release) != 0 {
				fail("hold with an action")
			}
		}
		if d.RequeueAfter < 0 || d.RequeueAfter > BatchMax && d.Reason == ReasonBatching {
			fail("requeue after %s", d.RequeueAfter)
		}
		for n, since := range d.State.EmptySince {
			if busy[n] > 0 || !joined[n] || since.After(in.Now) {
				fail("empty since %s for %s", since, n)
			}
		}
		// A second decision a moment later with the returned state never releases a node
		// the first one saw busy.
		again := in
		again.State = d.State
		again.Now = in.Now.Add(time.Millisecond)
		if d2 := Decide(again); d2.Action == Release {
			for _, n := range d2.Release {
				if busy[n] > 0 {
					fail("second pass releases busy %s", n)
				}
			}
		}
	}
	for _, a := range []Action{Provision, Release, Hold} {
		if counts[a] < 500 {
			t.Fatalf("the generator reached %s only %d times: %v", a, counts[a], counts)
		}
	}
	t.Logf("actions over 20000 random clusters: %v", counts)
}

// TestDecideSimulatedProperties checks, over random clusters with random simulation facts,
// that the simulation decides: pods it places nowhere are reported and block nothing, pods
// that fit an existing node rent nothing, and new nodes are the simulation's, within maxNodes.
func TestDecideSimulatedProperties(t *testing.T) {
	r := rand.New(rand.NewSource(32))
	counts := map[Action]int{}
	for i := 0; i < 20000; i++ {
		in := randomInput(r)
		sim := &Simulation{Unplaced: map[string]string{}, OnNodes: map[string]string{}}
		var unplaced []string
		asking, waiting := 0, 0 // pending pods that ask for a new node, that fit an existing one
		for _, p := range in.Pods {
			if !p.Unschedulable || p.Node != "" || p.Finished || p.Daemon {
				continue
			}
			switch r.Intn(3) {
			case 0:
				sim.Unplaced[p.Name] = "Insufficient cpu"
				unplaced = append(unplaced, p.Name)
			case 1:
				sim.OnNodes[p.Name] = "n1"
				waiting++
			default:
				asking++
			}
		}
		if asking > 0 {
			sim.NewNodes = r.Intn(asking + 1)
		}
		in.Simulated = sim
		d := Decide(in)
		counts[d.Action]++
		fail := func(format string, a ...any) {
			t.Helper()
			t.Fatalf("case %d: %s\ninput: %+v\nsimulated: %+v\ndecision: %+v", i, fmt.Sprintf(format, a...), in, *sim, d)
		}
		slices.Sort(unplaced)
		if !slices.Equal(unplaced, d.Unfittable) {
			fail("unfittable %v, want the unplaced %v", d.Unfittable, unplaced)
		}
		for _, name := range unplaced {
			if d.UnfittableWhy[name] != "Insufficient cpu" {
				fail("%s reported without its reason", name)
			}
		}
		joined := map[string]bool{}
		for _, n := range in.Nodes {
			joined[n.Name] = true
		}
		total := len(in.Nodes)
		for _, c := range in.Claims {
			if !joined[c.NodeName] {
				total++
			}
		}
		switch d.Action {
		case Provision:
			if asking == 0 {
				fail("provision although every pending pod fits an existing node or none")
			}
			if d.Provision != min(sim.NewNodes, in.MaxNodes-total) {
				fail("provision %d, want the simulation's %d within maxNodes %d less %d", d.Provision, sim.NewNodes, in.MaxNodes, total)
			}
		case Release:
			if asking+waiting > 0 {
				fail("release with %d pending pods that fit a node", asking+waiting)
			}
		case Hold:
			if d.Reason == ReasonFitsExisting && asking > 0 {
				fail("holds for existing nodes although %d pods ask for a new one", asking)
			}
		}
		// Without the pods placed nowhere the decision is the same: they block nothing.
		without := in
		without.Pods = slices.DeleteFunc(slices.Clone(in.Pods), func(p Pod) bool { return slices.Contains(unplaced, p.Name) })
		d2 := Decide(without)
		d2.Unfittable, d2.UnfittableWhy = d.Unfittable, d.UnfittableWhy
		if diff := cmp.Diff(d, d2); diff != "" {
			fail("the unplaced pods change the decision (-with +without):\n%s", diff)
		}
	}
	for _, a := range []Action{Provision, Release, Hold} {
		if counts[a] < 500 {
			t.Fatalf("the generator reached %s only %d times: %v", a, counts[a], counts)
		}
	}
	t.Logf("actions over 20000 random clusters: %v", counts)
}

func settledPod(p Pod) Pod { p.OwnerSettled = true; return p }

func TestDecideReplacement(t *testing.T) {
	hold := time.Minute
	nodes := []Node{{Name: "n1"}, {Name: "n2"}}
	claims := []Claim{{Name: "c1", NodeName: "n1"}, {Name: "c2", NodeName: "n2"}}
	busy := []Pod{{Name: "a", Node: "n1"}, {Name: "b", Node: "n2"}}
	r := &Replacement{Nodes: []string{"n1", "n2"}, Size: Size{CPUs: 2, MemMiB: 512}, MaxPrice: Price{Cost: 219, Currency: "USD"}}
	long := State{ReplaceableSince: map[string]time.Time{"n1,n2": t0.Add(-time.Hour)}}
	// The replacement n3 has joined, with its claim saying what it replaces.
	joinedRepl := append(slices.Clone(nodes), Node{Name: "n3"})
	replClaims := append(slices.Clone(claims), Claim{Name: "c3", NodeName: "n3", Replaces: []string{"n2", "n1"}})
	cases := []decideCase{{
		name: "replaceable past hold: rent one node capped below the two",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r, State: long},
		want: Decision{Action: Provision, Provision: 1, Sizes: []Size{{CPUs: 2, MemMiB: 512}}, Replaces: []string{"n1", "n2"},
			MaxPrice: &Price{Cost: 219, Currency: "USD"}, Reason: ReasonReplaceCheaper},
	}, {
		name: "replaceable within hold: wait",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r},
		want: Decision{Action: Hold, Reason: ReasonReplaceWithinHold, RequeueAfter: hold},
	}, {
		name: "tried recently: not offered again until the retry",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r,
			State: State{ReplaceableSince: long.ReplaceableSince, ReplaceTried: map[string]time.Time{"n1,n2": t0.Add(-time.Minute)}}},
		want: Decision{Action: Hold, Reason: ReasonReplaceTried, RequeueAfter: ReplaceRetry - time.Minute},
	}, {
		name: "tried long ago: offered again",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r,
			State: State{ReplaceableSince: long.ReplaceableSince, ReplaceTried: map[string]time.Time{"n1,n2": t0.Add(-ReplaceRetry)}}},
		want: Decision{Action: Provision, Provision: 1, Sizes: []Size{{CPUs: 2, MemMiB: 512}}, Replaces: []string{"n1", "n2"},
			MaxPrice: &Price{Cost: 219, Currency: "USD"}, Reason: ReasonReplaceCheaper},
	}, {
		name: "at maxNodes: no room to rent the replacement first",
		in:   Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 2, Hold: hold, Replacement: r, State: long},
		want: Decision{Action: Hold, Reason: ReasonBusy},
	}, {
		name: "a node to drain outright comes first",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r, Consolidatable: []string{"n2"},
			State: State{ConsolidatableSince: map[string]time.Time{"n2": t0.Add(-time.Hour)}, ReplaceableSince: long.ReplaceableSince}},
		want: Decision{Action: Drain, Drain: []string{"n2"}, Reason: ReasonUnderutilized},
	}, {
		name: "the replacement in flight: nothing else",
		in: Input{Now: t0, Pods: busy, Nodes: nodes, Claims: replClaims, MaxNodes: 3, Hold: hold, Replacement: r,
			State: State{ReplaceableSince: long.ReplaceableSince, ReplaceTried: map[string]time.Time{"n1,n2": t0}}},
		want: Decision{Action: Hold, Reason: ReasonReplacing},
	}, {
		name: "the replacement joined: drain what it replaces, together",
		in:   Input{Now: t0, Pods: busy, Nodes: joinedRepl, Claims: replClaims, MaxNodes: 3, Hold: hold},
		want: Decision{Action: Drain, Drain: []string{"n1", "n2"}, Reason: ReasonReplaced},
	}, {
		name: "the replaced nodes draining: the empty replacement is kept past its hold",
		in: Input{Now: t0, Pods: busy, Nodes: []Node{{Name: "n1", Draining: true}, {Name: "n2", Draining: true}, {Name: "n3"}}, Claims: replClaims,
			MaxNodes: 3, Hold: hold, State: State{EmptySince: map[string]time.Time{"n3": t0.Add(-time.Hour)}}},
		want: Decision{Action: Hold, Reason: ReasonDraining, RequeueAfter: DrainRetry},
	}, {
		name: "the replaced nodes drained: released at once",
		in: Input{Now: t0, Pods: []Pod{{Name: "a", Node: "n3"}, {Name: "b", Node: "n3"}}, Nodes: []Node{{Name: "n1", Draining: true}, {Name: "n2", Draining: true}, {Name: "n3"}},
			Claims: replClaims, MaxNodes: 3, Hold: hold},
		want: Decision{Action: Release, Release: []string{"n1", "n2"}, ReleaseClaims: []string{"c1", "c2"}, Reason: ReasonDrained},
	}, {
		name: "the replaced nodes gone: the replacement is a node like any other",
		in: Input{Now: t0, Nodes: []Node{{Name: "n3"}}, Claims: []Claim{{Name: "c3", NodeName: "n3", Replaces: []string{"n1", "n2"}}}, MaxNodes: 3, Hold: hold,
			State: State{EmptySince: map[string]time.Time{"n3": t0.Add(-time.Hour)}}},
		want: Decision{Action: Release, Release: []string{"n3"}, ReleaseClaims: []string{"c3"}, Reason: ReasonEmptyPastHold},
	}}
	checkDecide(t, cases)
	// A rented replacement is remembered, and the memory kept for ReplaceRetry only.
	st := Decide(Input{Now: t0, Pods: busy, Nodes: nodes, Claims: claims, MaxNodes: 3, Hold: hold, Replacement: r,
		State: State{ReplaceableSince: long.ReplaceableSince, ReplaceTried: map[string]time.Time{"old": t0.Add(-ReplaceRetry)}}}).State
	if diff := cmp.Diff(map[string]time.Time{"n1,n2": t0}, st.ReplaceTried); diff != "" {
		t.Errorf("ReplaceTried (-want +got):\n%s", diff)
	}
}
