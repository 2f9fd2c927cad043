package infra

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
)

func TestClusterInfraAndEntryNames(t *testing.T) {
	// sha256("acct-abc/web") and sha256("uid-1"), cut.
	if got, want := ClusterInfraName("acct-abc", "web"), "nodes-"; got[:6] != want || len(got) != 26 {
		t.Fatalf("ClusterInfraName = %q", got)
	}
	if ClusterInfraName("acct-abc", "web") == ClusterInfraName("acct-abd", "web") {
		t.Fatal("names collide")
	}
	if got := NodeEntryName("uid-1"); !regexp.MustCompile(`^node-[0-9a-f]{12}$`).MatchString(got) || got == NodeEntryName("uid-2") {
		t.Fatalf("NodeEntryName = %q", got)
	}
	infraName := ClusterInfraName("acct-abc", "web")
	entry := NodeEntryName("uid-1")
	cc := ContractName(KindInfra, infraName, entry)
	if len(cc) != 50 {
		t.Fatalf("ComputeContract name %q is %d characters, want 50", cc, len(cc))
	}
	if got := NodeBundleSecretName(infraName, entry); got != cc+"-join" {
		t.Fatalf("NodeBundleSecretName = %q", got)
	}
}

func TestNodeEntryState(t *testing.T) {
	cases := []struct {
		deleting bool
		phase    v1alpha1.NodeClaimPhase
		bundle   bool
		want     v1alpha1.ContractState
	}{
		{false, "", false, v1alpha1.ContractStaged},
		{false, v1alpha1.NodeClaimPending, false, v1alpha1.ContractStaged},
		{false, v1alpha1.NodeClaimPending, true, v1alpha1.ContractRequested},
		{false, v1alpha1.NodeClaimRunning, true, v1alpha1.ContractRequested},
		{true, v1alpha1.NodeClaimRunning, true, v1alpha1.ContractReleased},
		{true, "", false, v1alpha1.ContractReleased},
		{false, v1alpha1.NodeClaimFailed, true, v1alpha1.ContractReleased},
		{false, v1alpha1.NodeClaimLost, true, v1alpha1.ContractReleased},
		{false, v1alpha1.NodeClaimReleased, true, v1alpha1.ContractReleased},
	}
	for _, tc := range cases {
		if got := NodeEntryState(tc.deleting, tc.phase, tc.bundle); got != tc.want {
			t.Errorf("NodeEntryState(%v, %q, %v) = %s, want %s", tc.deleting, tc.phase, tc.bundle, got, tc.want)
		}
	}
}

func nodeEntry(name string, state v1alpha1.ContractState) *NodeEntry {
	return &NodeEntry{Name: name, State: state, VMName: "vm-" + name,
		Node:   v1alpha1.InfraContractNode{OwnerDid: "did:plc:o", NodeJoin: &v1alpha1.NodeJoin{Server: "https://s", NodeName: name}, NodeClaimRef: &v1alpha1.ObjectRef{Namespace: "acct", Name: "c-" + name}},
		Bundle: &v1alpha1.SecretKeyRef{Name: name + "-join"}}
}

func TestComposeNodeEntry(t *testing.T) {
	c := ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: "acct", Name: "web"}}
	at := metav1.Unix(100, 0)
	base := ComposeNodeEntry(v1alpha1.InfraSpec{}, c, "a", nodeEntry("a", v1alpha1.ContractRequested))
	base = ComposeNodeEntry(base, c, "b", nodeEntry("b", v1alpha1.ContractStaged))
	base.Contracts[0].ReleaseRequestedAt = &at
	record := &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "repo"}}
	base.Record = record

	t.Run("add appends and names the cluster", func(t *testing.T) {
		if len(base.Contracts) != 2 || base.Contracts[1].Name != "b" || base.Contracts[1].ComputeKind != v1alpha1.ComputeKindNode {
			t.Fatalf("contracts %+v", base.Contracts)
		}
		if base.ClusterRef == nil || *base.ClusterRef != c.Cluster || base.Description != "nodes of tenant cluster web" {
			t.Fatalf("clusterRef %v, description %q", base.ClusterRef, base.Description)
		}
		if len(base.Nodes) != 2 || base.Nodes[1].Contract != "b" || len(base.Secrets) != 2 || base.Secrets[1].Contract != "b" {
			t.Fatalf("nodes %+v secrets %+v", base.Nodes, base.Secrets)
		}
	})
	t.Run("a new entry takes the required layers, isolation and architecture; a declared one keeps its own", func(t *testing.T) {
		want := nodeEntry("c", v1alpha1.ContractStaged)
		want.RequireLayers = []string{"pod-user-namespaces"}
		want.RequireIsolation = v1alpha1.IsolationVM
		want.RequireArch = "arm64"
		got := ComposeNodeEntry(base, c, "c", want)
		if k := got.Contracts[2]; !slices.Equal(k.RequireLayers, []string{"pod-user-namespaces"}) || k.RequireIsolation != v1alpha1.IsolationVM || k.RequireArch != "arm64" {
			t.Fatalf("new entry's layers %v, isolation %q, arch %q", k.RequireLayers, k.RequireIsolation, k.RequireArch)
		}
		if e, _ := NodeEntryOf(got, "c"); !slices.Equal(e.RequireLayers, []string{"pod-user-namespaces"}) || e.RequireIsolation != v1alpha1.IsolationVM || e.RequireArch != "arm64" {
			t.Fatalf("NodeEntryOf layers %v, isolation %q, arch %q", e.RequireLayers, e.RequireIsolation, e.RequireArch)
		}
		again := nodeEntry("c", v1alpha1.ContractRequested) // the cluster's policy changed meanwhile
		got = ComposeNodeEntry(got, c, "c", again)
		if k := got.Contracts[2]; !slices.Equal(k.RequireLayers, []string{"pod-user-namespaces"}) || k.RequireIsolation != v1alpha1.IsolationVM || k.RequireArch != "arm64" {
			t.Fatalf("a declared entry's requirements changed to %v, %q, %q", k.RequireLayers, k.RequireIsolation, k.RequireArch)
		}
	})
	t.Run("replace changes only its entry and keeps the others and the record", func(t *testing.T) {
		got := ComposeNodeEntry(base, c, "b", nodeEntry("b", v1alpha1.ContractRequested))
		if got.Contracts[1].State != v1alpha1.ContractRequested {
			t.Fatalf("b not Requested: %+v", got.Contracts[1])
		}
		if diff := cmp.Diff(base.Contracts[0], got.Contracts[0]); diff != "" {
			t.Fatalf("entry a changed:\n%s", diff)
		}
		if got.Record != record && (got.Record == nil || got.Record.RepoRef != record.RepoRef) {
			t.Fatalf("record binding lost")
		}
	})
	t.Run("release keeps releaseRequestedAt", func(t *testing.T) {
		got := ComposeNodeEntry(base, c, "a", nodeEntry("a", v1alpha1.ContractReleased))
		if got.Contracts[0].State != v1alpha1.ContractReleased || got.Contracts[0].ReleaseRequestedAt == nil {
			t.Fatalf("a = %+v", got.Contracts[0])
		}
	})
	t.Run("drop removes the contract, its node and its secret", func(t *testing.T) {
		got := ComposeNodeEntry(base, c, "a", nil)
		if len(got.Contracts) != 1 || got.Contracts[0].Name != "b" || len(got.Nodes) != 1 || got.Nodes[0].Contract != "b" || len(got.Secrets) != 1 || got.Secrets[0].Contract != "b" {
			t.Fatalf("after drop: %+v", got)
		}
		last := ComposeNodeEntry(got, c, "b", nil)
		if last.Contracts != nil || last.Nodes != nil || last.Secrets != nil {
			t.Fatalf("after the last drop: %+v", last)
		}
	})
	t.Run("no bundle yet: no secret", func(t *testing.T) {
		e := nodeEntry("c", v1alpha1.ContractStaged)
		e.Bundle = nil
		got := ComposeNodeEntry(base, c, "c", e)
		for _, s := range got.Secrets {
			if s.Contract == "c" {
				t.Fatalf("secret for c without a bundle")
			}
		}
		if back, ok := NodeEntryOf(got, "c"); !ok || back.Bundle != nil || back.Node.Contract != "c" {
			t.Fatalf("NodeEntryOf = %+v, %v", back, ok)
		}
	})
	t.Run("the input is not changed", func(t *testing.T) {
		before := base.DeepCopy()
		ComposeNodeEntry(base, c, "a", nil)
		ComposeNodeEntry(base, c, "b", nodeEntry("b", v1alpha1.ContractReleased))
		if diff := cmp.Diff(before, &base); diff != "" {
			t.Fatalf("input changed:\n%s", diff)
		}
	})
}

// TestComposeNodeEntryProperty composes random sequences of entry changes, each on the spec
// the previous one left (as the lock serialises them), and checks the result holds exactly
// the entries last written, each with its own fields.
func TestComposeNodeEntryProperty(t *testing.T) {
	r := rand.New(rand.NewSource(31))
	c := ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: "acct", Name: "web"}}
	states := []v1alpha1.ContractState{v1alpha1.ContractStaged, v1alpha1.ContractRequested, v1alpha1.ContractReleased}
	for i := 0; i < 2000; i++ {
		var spec v1alpha1.InfraSpec
		want := map[string]*NodeEntry{}
		for j := 0; j < 1+r.Intn(20); j++ {
			name := fmt.Sprintf("node-%d", r.Intn(6))
			if r.Intn(4) == 0 {
				spec = ComposeNodeEntry(spec, c, name, nil)
				delete(want, name)
				continue
			}
			e := nodeEntry(name, states[r.Intn(3)])
			if r.Intn(3) == 0 {
				e.Bundle = nil
			}
			spec = ComposeNodeEntry(spec, c, name, e)
			want[name] = e
		}
		if len(spec.Contracts) != len(want) || len(spec.Nodes) != len(want) {
			t.Fatalf("case %d: %d contracts, %d nodes, want %d", i, len(spec.Contracts), len(spec.Nodes), len(want))
		}
		for name, w := range want {
			got, ok := NodeEntryOf(spec, name)
			if !ok {
				t.Fatalf("case %d: entry %s lost", i, name)
			}
			wn := w.Node
			wn.Contract = name
			if got.State != w.State || got.VMName != w.VMName || !cmp.Equal(got.Node, wn) || !cmp.Equal(got.Bundle, w.Bundle) {
				t.Fatalf("case %d: entry %s = %+v, want %+v", i, name, got, w)
			}
		}
	}
}

func TestNodeClaimPhaseOf(t *testing.T) {
	cc := func(p v1alpha1.ComputeContractPhase) *v1alpha1.ComputeContractStatus {
		return &v1alpha1.ComputeContractStatus{Phase: p}
	}
	up := &v1alpha1.ComputeContractStatus{Phase: v1alpha1.ComputeContractHeld, Guest: &v1alpha1.GuestStatus{Address: "10.0.0.2"}}
	ready := &v1alpha1.ComputeContractStatus{Phase: v1alpha1.ComputeContractHeld, Events: []v1alpha1.ContractEvent{{Type: "ready"}}}
	cases := []struct {
		name string
		in   NodeClaimObservation
		want v1alpha1.NodeClaimPhase
	}{
		{"no entry yet", NodeClaimObservation{}, v1alpha1.NodeClaimPending},
		{"staged", NodeClaimObservation{Entry: v1alpha1.ContractStaged}, v1alpha1.NodeClaimPending},
		{"requested, no contract yet", NodeClaimObservation{Entry: v1alpha1.ContractRequested}, v1alpha1.NodeClaimBidding},
		{"requested, adopt", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Adopt: true, Contract: cc(v1alpha1.ComputeContractRequesting)}, v1alpha1.NodeClaimAdopting},
		{"requesting", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: cc(v1alpha1.ComputeContractRequesting)}, v1alpha1.NodeClaimBidding},
		{"held", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: cc(v1alpha1.ComputeContractHeld)}, v1alpha1.NodeClaimProvisioning},
		{"held, guest address", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: up}, v1alpha1.NodeClaimJoining},
		{"held, ready event", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: ready}, v1alpha1.NodeClaimJoining},
		{"held, node ready", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: up, NodeReady: true}, v1alpha1.NodeClaimRunning},
		{"failed", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: cc(v1alpha1.ComputeContractFailed)}, v1alpha1.NodeClaimFailed},
		{"guest released unasked", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: cc(v1alpha1.ComputeContractReleased)}, v1alpha1.NodeClaimLost},
		{"contract gone unasked", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Observed: v1alpha1.InfraContractReleased}, v1alpha1.NodeClaimLost},
		{"release in flight keeps the phase", NodeClaimObservation{Entry: v1alpha1.ContractReleased, Contract: cc(v1alpha1.ComputeContractReleasing), Previous: v1alpha1.NodeClaimRunning}, v1alpha1.NodeClaimRunning},
		{"released", NodeClaimObservation{Entry: v1alpha1.ContractReleased, Contract: cc(v1alpha1.ComputeContractReleased), Previous: v1alpha1.NodeClaimRunning}, v1alpha1.NodeClaimReleased},
		{"released, contract gone", NodeClaimObservation{Entry: v1alpha1.ContractReleased, Previous: v1alpha1.NodeClaimRunning}, v1alpha1.NodeClaimReleased},
		{"release failed", NodeClaimObservation{Entry: v1alpha1.ContractReleased, Contract: cc(v1alpha1.ComputeContractFailed)}, v1alpha1.NodeClaimFailed},
		{"terminal stays", NodeClaimObservation{Entry: v1alpha1.ContractRequested, Contract: cc(v1alpha1.ComputeContractHeld), Previous: v1alpha1.NodeClaimLost}, v1alpha1.NodeClaimLost},
	}
	for _, tc := range cases {
		if got := NodeClaimPhaseOf(tc.in); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestStaleNodeEntries(t *testing.T) {
	c := ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: "acct", Name: "web"}}
	var spec v1alpha1.InfraSpec
	for _, uid := range []string{"u1", "u2", "u3"} {
		e := nodeEntry(NodeEntryName(uid), v1alpha1.ContractRequested)
		e.Node.NodeClaimRef = &v1alpha1.ObjectRef{Namespace: "acct", Name: "claim-" + uid}
		spec = ComposeNodeEntry(spec, c, e.Name, e)
	}
	spec.Contracts = append(spec.Contracts, v1alpha1.InfraContract{Name: "stray"})
	claims := map[string]string{"acct/claim-u1": "u1", "acct/claim-u2": "u2-recreated"}
	got := StaleNodeEntries(spec, claims)
	want := []string{NodeEntryName("u2"), NodeEntryName("u3"), "stray"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("StaleNodeEntries (-want +got):\n%s", diff)
	}
}

// A cluster's Infra as the NodeClaim controller composes it renders a record with the
// entries' names, states and vmNames, and nothing of spec.nodes, spec.secrets or clusterRef.
func TestRenderRecordOfAClusterInfraLeaksNoNodeField(t *testing.T) {
	c := ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: "acct-leakhome", Name: "web"}}
	var spec v1alpha1.InfraSpec
	for _, uid := range []string{"u1", "u2"} {
		e := &NodeEntry{Name: NodeEntryName(uid), State: v1alpha1.ContractRequested, VMName: "vm-" + uid,
			Node: v1alpha1.InfraContractNode{OwnerDid: "did:plc:leakowner", Adopt: true,
				NodeJoin:     &v1alpha1.NodeJoin{Server: "https://leak-server:6443", NodeName: "leaknode", BundleSecretRef: &v1alpha1.SecretKeyRef{Name: "leak-bundle"}},
				NodeClaimRef: &v1alpha1.ObjectRef{Namespace: "acct-leakhome", Name: "leakclaim"}},
			Bundle: &v1alpha1.SecretKeyRef{Name: "leak-join"}}
		spec = ComposeNodeEntry(spec, c, e.Name, e)
	}
	rec, err := RenderRecord(KindInfra, metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)}, v1alpha1.EphemeralInfraSpec{InfraSpec: spec}, v1alpha1.EphemeralInfraStatus{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"leak", "nodeJoin", "ownerDid", "nodeClaimRef", "adopt", "secret", "clusterRef", "bundle"} {
		if strings.Contains(strings.ToLower(string(b)), strings.ToLower(w)) {
			t.Errorf("record carries %q: %s", w, b)
		}
	}
	for _, w := range []string{NodeEntryName("u1"), NodeEntryName("u2"), "vm-u1", `"requested"`} {
		if !strings.Contains(string(b), w) {
			t.Errorf("record lacks %s: %s", w, b)
		}
	}
}

func TestNodeOverdue(t *testing.T) {
	g := NodeGraces{Join: 3 * time.Minute, Loss: 2 * time.Minute}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rows := []struct {
		name          string
		ready, joined bool
		waited        time.Duration
		grace         NodeGraces
		lost          bool
		wait          time.Duration
	}{
		{"ready: never overdue", true, true, time.Hour, g, false, 0},
		{"ready before joining: never overdue", true, false, time.Hour, g, false, 0},
		{"waiting to join, within grace", false, false, time.Minute, g, false, 2 * time.Minute},
		{"never joined, past the join grace", false, false, 3 * time.Minute, g, true, 0},
		{"joined then not ready, within the loss grace", false, true, time.Minute, g, false, time.Minute},
		{"joined then not ready past the loss grace", false, true, 2 * time.Minute, g, true, 0},
		{"joined: the join grace does not apply", false, true, 150 * time.Second, NodeGraces{Join: time.Hour, Loss: 2 * time.Minute}, true, 0},
		{"a zero grace never expires", false, false, time.Hour, NodeGraces{}, false, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			lost, msg, wait := NodeOverdue(row.ready, row.joined, t0, t0.Add(row.waited), row.grace)
			if lost != row.lost || wait != row.wait {
				t.Fatalf("lost %v wait %s, want %v %s", lost, wait, row.lost, row.wait)
			}
			if lost && msg == "" {
				t.Fatal("a lost claim needs a message")
			}
		})
	}
}
