package infra

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"socialweb.computer/api/v1alpha1"
)

func TestContractName(t *testing.T) {
	long := strings.Repeat("a", 240) + ".b"
	tests := []struct {
		name           string
		kind           Kind
		object, contr  string
		want           string
		wantHashedFrom string
	}{
		{name: "infra", kind: KindInfra, object: "web", contr: "db", want: "infra-web-db"},
		{name: "ephemeral", kind: KindEphemeralInfra, object: "ci", contr: "job", want: "einfra-ci-job"},
		{name: "253 exactly stays", kind: KindInfra, object: strings.Repeat("a", 253-len("infra--x")), contr: "x",
			want: "infra-" + strings.Repeat("a", 253-len("infra--x")) + "-x"},
		{name: "longer is hashed", kind: KindInfra, object: long, contr: "worker", wantHashedFrom: "infra-" + long + "-worker"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ContractName(tc.kind, tc.object, tc.contr)
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("%q is not a valid name: %v", got, errs)
			}
			if got != ContractName(tc.kind, tc.object, tc.contr) {
				t.Error("not deterministic")
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("got %q; want %q", got, tc.want)
			}
			if tc.wantHashedFrom != "" {
				if len(got) > 253 || !strings.HasPrefix(got, "infra-aaaa") || got == tc.wantHashedFrom {
					t.Errorf("got %q (%d)", got, len(got))
				}
				if other := ContractName(tc.kind, tc.object, tc.contr+"2"); other == got {
					t.Error("two contracts share a hashed name")
				}
			}
		})
	}
	if got := RecordChildName(KindEphemeralInfra, "ci"); got != "einfra-ci" {
		t.Errorf("RecordChildName = %q", got)
	}
	labels := ContractLabels(KindInfra, strings.Repeat("n", 100), "db")
	for k, v := range labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s=%q: %v", k, v, errs)
		}
	}
}

func TestObservePhase(t *testing.T) {
	cc := func(p v1alpha1.ComputeContractPhase) *v1alpha1.ComputeContractStatus {
		return &v1alpha1.ComputeContractStatus{Phase: p}
	}
	tests := []struct {
		name    string
		desired v1alpha1.ContractState
		cc      *v1alpha1.ComputeContractStatus
		existed bool
		want    v1alpha1.InfraContractPhase
	}{
		{"none, staged", v1alpha1.ContractStaged, nil, false, v1alpha1.InfraContractStaged},
		{"none, default state", "", nil, false, v1alpha1.InfraContractStaged},
		{"none, back to staged after it existed", v1alpha1.ContractStaged, nil, true, v1alpha1.InfraContractStaged},
		{"none, requested, being created", v1alpha1.ContractRequested, nil, false, v1alpha1.InfraContractRequesting},
		{"gone after it existed", v1alpha1.ContractRequested, nil, true, v1alpha1.InfraContractReleased},
		{"none, released, nothing ran", v1alpha1.ContractReleased, nil, false, v1alpha1.InfraContractReleased},
		{"no phase yet", v1alpha1.ContractRequested, cc(""), false, v1alpha1.InfraContractRequesting},
		{"pending", v1alpha1.ContractRequested, cc(v1alpha1.ComputeContractPending), false, v1alpha1.InfraContractRequesting},
		{"requesting", v1alpha1.ContractRequested, cc(v1alpha1.ComputeContractRequesting), false, v1alpha1.InfraContractRequesting},
		{"held", v1alpha1.ContractRequested, cc(v1alpha1.ComputeContractHeld), false, v1alpha1.InfraContractDeployed},
		{"releasing", v1alpha1.ContractReleased, cc(v1alpha1.ComputeContractReleasing), true, v1alpha1.InfraContractReleasing},
		{"released", v1alpha1.ContractReleased, cc(v1alpha1.ComputeContractReleased), true, v1alpha1.InfraContractReleased},
		{"failed", v1alpha1.ContractRequested, cc(v1alpha1.ComputeContractFailed), true, v1alpha1.InfraContractFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ObservePhase(tc.desired, tc.cc, tc.existed); got != tc.want {
				t.Errorf("got %s; want %s", got, tc.want)
			}
		})
	}
}

func TestPlanContracts(t *testing.T) {
	now := t0.Add(time.Hour)
	nowT := metav1.NewTime(now)
	older, newer := metav1.NewTime(t0), metav1.NewTime(t0.Add(30*time.Minute))
	existing := func(contract string, p v1alpha1.ComputeContractPhase, rel *metav1.Time) ExistingContract {
		e := ExistingContract{Name: ContractName(KindInfra, "web", contract), Contract: contract, Status: v1alpha1.ComputeContractStatus{Phase: p}}
		if rel != nil {
			e.Release = &v1alpha1.ContractRelease{RequestedAt: *rel}
		}
		return e
	}
	prev := func(contract string, phase v1alpha1.InfraContractPhase) v1alpha1.InfraContractStatus {
		return v1alpha1.InfraContractStatus{Name: contract, Phase: phase, ComputeContract: ContractName(KindInfra, "web", contract)}
	}
	c := func(name string, s v1alpha1.ContractState) v1alpha1.InfraContract {
		return v1alpha1.InfraContract{Name: name, State: s}
	}
	type act struct {
		Contract string
		Op       ContractOp
		Release  *metav1.Time
	}
	type phase struct {
		Name  string
		Phase v1alpha1.InfraContractPhase
	}
	tests := []struct {
		name      string
		contracts []v1alpha1.InfraContract
		previous  []v1alpha1.InfraContractStatus
		existing  []ExistingContract
		ended     bool
		want      []act
		phases    []phase
	}{
		{name: "staged: nothing, no RFP", contracts: []v1alpha1.InfraContract{c("a", "")},
			want: []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractStaged}}},
		{name: "requested: create", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested)},
			want: []act{{"a", OpCreate, nil}}, phases: []phase{{"a", v1alpha1.InfraContractRequesting}}},
		{name: "requested and running: nothing", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested)},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractHeld, nil)},
			want:     []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractDeployed}}},
		{name: "terminal is not requested again", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested)},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractFailed, nil)},
			want:     []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractFailed}}},
		{name: "removed after it finished is not requested again", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested)},
			previous: []v1alpha1.InfraContractStatus{prev("a", v1alpha1.InfraContractReleased)},
			want:     []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractReleased}}},
		{name: "back to staged deletes the finished one", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractStaged)},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractReleased, &older)},
			want:     []act{{"a", OpDelete, nil}}, phases: []phase{{"a", v1alpha1.InfraContractStaged}}},
		{name: "back to staged releases a running one first", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractStaged)},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractHeld, nil)},
			want:     []act{{"a", OpSetRelease, &nowT}}, phases: []phase{{"a", v1alpha1.InfraContractDeployed}}},
		{name: "staged again, then requested: a new one", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested)},
			previous: []v1alpha1.InfraContractStatus{{Name: "a", Phase: v1alpha1.InfraContractStaged}},
			want:     []act{{"a", OpCreate, nil}}, phases: []phase{{"a", v1alpha1.InfraContractRequesting}}},
		{name: "released: set release", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractReleased)},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractHeld, nil)},
			want:     []act{{"a", OpSetRelease, &nowT}}, phases: []phase{{"a", v1alpha1.InfraContractDeployed}}},
		{name: "released with its own time", contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractReleased, ReleaseRequestedAt: &older}},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractHeld, nil)},
			want:     []act{{"a", OpSetRelease, &older}}, phases: []phase{{"a", v1alpha1.InfraContractDeployed}}},
		{name: "released already: nothing", contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractReleased, ReleaseRequestedAt: &older}},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractReleasing, &older)},
			want:     []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractReleasing}}},
		{name: "newer releaseRequestedAt re-sends, failed included", contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractReleased, ReleaseRequestedAt: &newer}},
			existing: []ExistingContract{existing("a", v1alpha1.ComputeContractFailed, &older)},
			want:     []act{{"a", OpSetRelease, &newer}}, phases: []phase{{"a", v1alpha1.InfraContractFailed}}},
		{name: "released, never ran: nothing", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractReleased)},
			want: []act{{"a", OpNothing, nil}}, phases: []phase{{"a", v1alpha1.InfraContractReleased}}},
		{name: "dropped from spec: released, then deleted", contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractStaged)},
			existing: []ExistingContract{existing("z", v1alpha1.ComputeContractHeld, nil), existing("y", v1alpha1.ComputeContractFailed, nil), existing("x", v1alpha1.ComputeContractReleasing, &older)},
			want:     []act{{"a", OpNothing, nil}, {"x", OpNothing, nil}, {"y", OpDelete, nil}, {"z", OpSetRelease, &nowT}},
			phases:   []phase{{"a", v1alpha1.InfraContractStaged}, {"x", v1alpha1.InfraContractReleasing}, {"y", v1alpha1.InfraContractFailed}, {"z", v1alpha1.InfraContractDeployed}}},
		{name: "ended: every contract released, nothing created", ended: true,
			contracts: []v1alpha1.InfraContract{c("a", v1alpha1.ContractRequested), c("b", v1alpha1.ContractRequested), c("s", "")},
			existing:  []ExistingContract{existing("a", v1alpha1.ComputeContractHeld, nil)},
			want:      []act{{"a", OpSetRelease, &nowT}, {"b", OpNothing, nil}, {"s", OpNothing, nil}},
			phases:    []phase{{"a", v1alpha1.InfraContractDeployed}, {"b", v1alpha1.InfraContractReleased}, {"s", v1alpha1.InfraContractReleased}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := PlanContracts(ContractsInput{Kind: KindInfra, ObjectName: "web", Spec: v1alpha1.InfraSpec{Contracts: tc.contracts},
				Previous: tc.previous, Existing: tc.existing, Ended: tc.ended, Now: now})
			var got []act
			for _, a := range plan.Actions {
				var rel *metav1.Time
				if a.Release != nil {
					r := a.Release.RequestedAt
					rel = &r
				}
				got = append(got, act{a.Contract, a.Op, rel})
				if a.ComputeContract != ContractName(KindInfra, "web", a.Contract) {
					t.Errorf("%s: ComputeContract %q", a.Contract, a.ComputeContract)
				}
				if (a.Op == OpCreate) != (a.Spec != nil) {
					t.Errorf("%s: op %s with spec %v", a.Contract, a.Op, a.Spec)
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("actions (-want +got):\n%s", d)
			}
			var phases []phase
			for _, s := range plan.Status {
				phases = append(phases, phase{s.Name, s.Phase})
			}
			if d := cmp.Diff(tc.phases, phases); d != "" {
				t.Errorf("phases (-want +got):\n%s", d)
			}
		})
	}
}

func TestContractSpec(t *testing.T) {
	c := v1alpha1.InfraContract{Name: "a", State: v1alpha1.ContractRequested, ReleaseRequestedAt: mtime(t0), VMName: "vm", UserData: "#!",
		BidderDids: []string{"did:plc:b"}, DenyBidderDids: []string{"did:plc:d"}, SSHAuthorizedKeys: []string{"k"}, Policy: "p",
		RequireIsolation: v1alpha1.IsolationVM, PolicyArgs: map[string]string{"x": "1"}, VMReadyTimeoutSec: i32(9), Ports: []v1alpha1.ContractPort{{Name: "http", Port: 8080}}}
	secret := &v1alpha1.SecretKeyRef{Name: "s", Key: "k"}
	node := &v1alpha1.InfraContractNode{Contract: "a", OwnerDid: "did:plc:o", Adopt: true, NodeJoin: &v1alpha1.NodeJoin{Server: "https://api"},
		NodeClaimRef: &v1alpha1.ObjectRef{Name: "nc"}}
	tests := []struct {
		name   string
		c      v1alpha1.InfraContract
		secret *v1alpha1.SecretKeyRef
		node   *v1alpha1.InfraContractNode
		want   v1alpha1.ComputeContractSpec
	}{
		{name: "publishable fields", c: c, want: v1alpha1.ComputeContractSpec{VMName: "vm", ComputeKind: v1alpha1.ComputeKindVM, UserData: "#!",
			BidderDids: []string{"did:plc:b"}, DenyBidderDids: []string{"did:plc:d"}, SSHAuthorizedKeys: []string{"k"}, Policy: "p",
			RequireIsolation: v1alpha1.IsolationVM, PolicyArgs: map[string]string{"x": "1"}, VMReadyTimeoutSec: i32(9), Ports: []v1alpha1.ContractPort{{Name: "http", Port: 8080}}}},
		{name: "secret and node", c: v1alpha1.InfraContract{Name: "a", ComputeKind: v1alpha1.ComputeKindDeno}, secret: secret, node: node,
			want: v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, SecretsRef: secret, OwnerDid: "did:plc:o", Adopt: true,
				NodeJoin: &v1alpha1.NodeJoin{Server: "https://api"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ContractSpec(tc.c, tc.secret, tc.node)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if got.Release != nil || got.RepoRef != nil {
				t.Error("release or repoRef set")
			}
		})
	}
	// The spec shares nothing with the contract.
	got := ContractSpec(c, nil, nil)
	got.BidderDids[0], got.PolicyArgs["x"] = "changed", "changed"
	if c.BidderDids[0] != "did:plc:b" || c.PolicyArgs["x"] != "1" {
		t.Error("ContractSpec aliases the contract")
	}
}

func TestPlanContractsCreatesFromSpec(t *testing.T) {
	spec := v1alpha1.InfraSpec{
		Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractRequested, UserData: "x"}},
		Secrets:   []v1alpha1.InfraContractSecret{{Contract: "b", SecretRef: v1alpha1.SecretKeyRef{Name: "other"}}, {Contract: "a", SecretRef: v1alpha1.SecretKeyRef{Name: "mine"}}},
		Nodes:     []v1alpha1.InfraContractNode{{Contract: "a", OwnerDid: "did:plc:o"}},
	}
	plan := PlanContracts(ContractsInput{Kind: KindEphemeralInfra, ObjectName: "ci", Spec: spec, Now: t0})
	want := &v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindVM, UserData: "x", SecretsRef: &v1alpha1.SecretKeyRef{Name: "mine"}, OwnerDid: "did:plc:o"}
	if d := cmp.Diff(want, plan.Actions[0].Spec); d != "" || plan.Actions[0].ComputeContract != "einfra-ci-a" {
		t.Errorf("%s (-want +got):\n%s", plan.Actions[0].ComputeContract, d)
	}
	// A bound deployment's contracts run the market from its record's repo.
	spec.Record = &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me", Namespace: "acct-x"}}
	plan = PlanContracts(ContractsInput{Kind: KindEphemeralInfra, ObjectName: "ci", Spec: spec, Now: t0})
	want.RepoRef = &v1alpha1.ObjectRef{Name: "me", Namespace: "acct-x"}
	if d := cmp.Diff(want, plan.Actions[0].Spec); d != "" {
		t.Errorf("bound (-want +got):\n%s", d)
	}
	spec.Record.RepoRef.Name = "changed"
	if plan.Actions[0].Spec.RepoRef.Name != "me" {
		t.Error("the repoRef aliases the spec")
	}
}

func TestDeploymentPhase(t *testing.T) {
	st := func(phases ...v1alpha1.InfraContractPhase) []v1alpha1.InfraContractStatus {
		var out []v1alpha1.InfraContractStatus
		for i, p := range phases {
			out = append(out, v1alpha1.InfraContractStatus{Name: string(rune('a' + i)), Phase: p})
		}
		return out
	}
	const (
		S  = v1alpha1.InfraContractStaged
		Rq = v1alpha1.InfraContractRequesting
		D  = v1alpha1.InfraContractDeployed
		Rg = v1alpha1.InfraContractReleasing
		R  = v1alpha1.InfraContractReleased
		F  = v1alpha1.InfraContractFailed
	)
	tests := []struct {
		name            string
		contracts       []v1alpha1.InfraContractStatus
		deleting, ended bool
		want            v1alpha1.InfraPhase
	}{
		{"no contracts", nil, false, false, v1alpha1.InfraStaged},
		{"all staged", st(S, S), false, false, v1alpha1.InfraStaged},
		{"any requesting", st(D, Rq, S), false, false, v1alpha1.InfraDeploying},
		{"every requested deployed", st(D, D, S), false, false, v1alpha1.InfraDeployed},
		{"deployed and released", st(D, R), false, false, v1alpha1.InfraDeployed},
		{"releasing", st(D, Rg), false, false, v1alpha1.InfraReleasing},
		{"released", st(R, S), false, false, v1alpha1.InfraReleased},
		{"failed beats requesting", st(F, Rq), false, false, v1alpha1.InfraDegraded},
		{"failed beats deployed", st(F, D), false, false, v1alpha1.InfraDegraded},
		{"requesting beats releasing", st(Rq, Rg), false, false, v1alpha1.InfraDeploying},
		{"ending beats failed", st(F, D), false, true, v1alpha1.InfraEnding},
		{"ended when all finished", st(F, R, S), false, true, v1alpha1.InfraEnded},
		{"deleting beats everything", st(F, Rq), true, true, v1alpha1.InfraDeleting},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DeploymentPhase(tc.contracts, tc.deleting, tc.ended); got != tc.want {
				t.Errorf("got %s; want %s", got, tc.want)
			}
		})
	}
}

func TestContractsReady(t *testing.T) {
	spec := []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractRequested}, {Name: "b", State: v1alpha1.ContractRequested}, {Name: "c"}}
	status := []v1alpha1.InfraContractStatus{{Name: "a", Phase: v1alpha1.InfraContractDeployed}, {Name: "b", Phase: v1alpha1.InfraContractRequesting}, {Name: "c", Phase: v1alpha1.InfraContractDeployed}}
	if got := ContractsReady(spec, status); got != "1/2" {
		t.Errorf("got %q", got)
	}
}

func TestContractsByPhase(t *testing.T) {
	c := func(names ...string) []v1alpha1.InfraContract {
		var out []v1alpha1.InfraContract
		for _, n := range names {
			out = append(out, v1alpha1.InfraContract{Name: n})
		}
		return out
	}
	st := func(name string, p v1alpha1.InfraContractPhase) v1alpha1.InfraContractStatus {
		return v1alpha1.InfraContractStatus{Name: name, Phase: p}
	}
	for _, tc := range []struct {
		name   string
		spec   []v1alpha1.InfraContract
		status []v1alpha1.InfraContractStatus
		want   string
	}{
		{"nothing declared", nil, nil, "none"},
		{"one staged, no status yet", c("a"), nil, "1 Staged"},
		{"lifecycle order, not declaration order", c("a", "b", "c", "d"),
			[]v1alpha1.InfraContractStatus{st("a", v1alpha1.InfraContractFailed), st("b", v1alpha1.InfraContractStaged), st("c", v1alpha1.InfraContractDeployed), st("d", v1alpha1.InfraContractDeployed)},
			"2 Deployed, 1 Staged, 1 Failed"},
		{"a status of a contract no longer declared is not counted", c("a"),
			[]v1alpha1.InfraContractStatus{st("a", v1alpha1.InfraContractRequesting), st("gone", v1alpha1.InfraContractDeployed)}, "1 Requesting"},
		{"a phase this version does not know comes last", c("a", "b"),
			[]v1alpha1.InfraContractStatus{st("a", "Hibernating"), st("b", v1alpha1.InfraContractReleased)}, "1 Released, 1 Hibernating"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ContractsByPhase(tc.spec, tc.status); got != tc.want {
				t.Errorf("ContractsByPhase = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestEnded(t *testing.T) {
	exp := t0.Add(time.Hour)
	const (
		S  = v1alpha1.InfraContractStaged
		D  = v1alpha1.InfraContractDeployed
		R  = v1alpha1.InfraContractReleased
		F  = v1alpha1.InfraContractFailed
		Rq = v1alpha1.InfraContractRequesting
	)
	type out struct {
		Ended  bool
		Reason string
	}
	tests := []struct {
		name      string
		now       time.Time
		endWhen   v1alpha1.EndWhen
		phases    []v1alpha1.InfraContractPhase
		requested bool
		want      out
	}{
		{name: "running", now: t0, phases: []v1alpha1.InfraContractPhase{D}, requested: true},
		{name: "deadline", now: exp, phases: []v1alpha1.InfraContractPhase{D}, requested: true, want: out{true, EndReasonDeadline}},
		{name: "deadline with nothing requested", now: exp.Add(time.Second), want: out{true, EndReasonDeadline}},
		{name: "complete", now: t0, phases: []v1alpha1.InfraContractPhase{R, F, S}, requested: true, want: out{true, EndReasonComplete}},
		{name: "complete is the default", now: t0, endWhen: v1alpha1.EndWhenComplete, phases: []v1alpha1.InfraContractPhase{R}, requested: true, want: out{true, EndReasonComplete}},
		{name: "never requested: not complete", now: t0, phases: []v1alpha1.InfraContractPhase{S}},
		{name: "nothing requested yet, staged only", now: t0, phases: []v1alpha1.InfraContractPhase{S, S}, requested: true},
		{name: "one still requesting", now: t0, phases: []v1alpha1.InfraContractPhase{R, Rq}, requested: true},
		{name: "endWhen Deadline waits", now: t0, endWhen: v1alpha1.EndWhenDeadline, phases: []v1alpha1.InfraContractPhase{R}, requested: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, r := Ended(tc.now, exp, tc.endWhen, tc.phases, tc.requested)
			if d := cmp.Diff(tc.want, out{e, r}); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestExpiresAtAndRequeue(t *testing.T) {
	if got := ExpiresAt(t0, 0); !got.Equal(t0.Add(time.Hour)) {
		t.Errorf("default ttl: %v", got)
	}
	if got := ExpiresAt(t0, 120); !got.Equal(t0.Add(2 * time.Minute)) {
		t.Errorf("ttl 120: %v", got)
	}
	tests := []struct {
		name string
		now  time.Time
		want time.Duration
		ok   bool
	}{
		{"before", t0, 2 * time.Minute, true},
		{"at", t0.Add(2 * time.Minute), 0, false},
		{"after", t0.Add(time.Hour), 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := RequeueAfter(tc.now, ExpiresAt(t0, 120))
			if d != tc.want || ok != tc.ok {
				t.Errorf("got %v, %v", d, ok)
			}
		})
	}
}

func TestAnyRequested(t *testing.T) {
	tests := []struct {
		name     string
		previous []v1alpha1.InfraContractStatus
		existing []ExistingContract
		want     bool
	}{
		{"nothing", nil, nil, false},
		{"staged only", []v1alpha1.InfraContractStatus{{Name: "a", Phase: v1alpha1.InfraContractStaged}}, nil, false},
		{"owns one", nil, []ExistingContract{{Name: "x"}}, true},
		{"status saw one", []v1alpha1.InfraContractStatus{{Name: "a", Phase: v1alpha1.InfraContractReleased}}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := AnyRequested(tc.previous, tc.existing); got != tc.want {
				t.Errorf("got %v", got)
			}
		})
	}
}

func TestFinalizePlan(t *testing.T) {
	rel := &v1alpha1.ContractRelease{RequestedAt: metav1.NewTime(t0)}
	cc := func(name string, p v1alpha1.ComputeContractPhase, r *v1alpha1.ContractRelease) ExistingContract {
		return ExistingContract{Name: name, Status: v1alpha1.ComputeContractStatus{Phase: p}, Release: r}
	}
	tests := []struct {
		name     string
		existing []ExistingContract
		want     Finalize
	}{
		{name: "nothing left: done", want: Finalize{Done: true}},
		{name: "release the unfinished, delete the finished, wait",
			existing: []ExistingContract{cc("held", v1alpha1.ComputeContractHeld, nil), cc("gone", v1alpha1.ComputeContractReleased, rel),
				cc("failed", v1alpha1.ComputeContractFailed, nil), cc("pending", v1alpha1.ComputeContractPending, nil)},
			want: Finalize{Release: []string{"held", "pending"}, Delete: []string{"failed", "gone"}, Wait: true}},
		{name: "released, still releasing: wait only", existing: []ExistingContract{cc("r", v1alpha1.ComputeContractReleasing, rel)},
			want: Finalize{Wait: true}},
		{name: "all finished: delete, not yet done", existing: []ExistingContract{cc("r", v1alpha1.ComputeContractReleased, rel)},
			want: Finalize{Delete: []string{"r"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, FinalizePlan(tc.existing), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestNeedsReleaseFinalizer(t *testing.T) {
	repo := &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}}
	tests := []struct {
		name string
		spec v1alpha1.InfraSpec
		want bool
	}{
		{"empty", v1alpha1.InfraSpec{}, false},
		{"only staged contracts", v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "a"}, {Name: "b", State: v1alpha1.ContractStaged}}}, false},
		{"a requested contract", v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "a"}, {Name: "b", State: v1alpha1.ContractRequested}}}, true},
		{"a released contract", v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractReleased}}}, true},
		{"a record binding", v1alpha1.InfraSpec{Record: repo}, true},
	}
	for _, tt := range tests {
		if got := NeedsReleaseFinalizer(tt.spec); got != tt.want {
			t.Errorf("%s: NeedsReleaseFinalizer = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestRequesterRepo(t *testing.T) {
	if r := RequesterRepo(v1alpha1.InfraSpec{}); r != nil {
		t.Errorf("unbound deployment: %+v, want none", r)
	}
	if r := RequesterRepo(v1alpha1.InfraSpec{ClusterRef: &v1alpha1.ObjectRef{Name: "c"}}); r == nil || r.Name != NodeRequesterRepo || r.Namespace != "" {
		t.Errorf("unbound cluster Infra: %+v, want %s of its own workspace", r, NodeRequesterRepo)
	}
	bound := v1alpha1.InfraSpec{ClusterRef: &v1alpha1.ObjectRef{Name: "c"}, Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "mine"}}}
	if r := RequesterRepo(bound); r == nil || r.Name != NodeRequesterRepo {
		t.Errorf("bound cluster Infra: %+v, want %s: publishing does not change the requester", r, NodeRequesterRepo)
	}
	bound.ClusterRef = nil
	if r := RequesterRepo(bound); r == nil || r.Name != "mine" {
		t.Errorf("bound: %+v, want its record's repo", r)
	}
}
