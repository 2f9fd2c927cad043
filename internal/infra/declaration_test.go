package infra

import (
	"errors"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC)

func mtime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }
func i32(v int32) *int32             { return &v }

func TestDeclarationFromRecord(t *testing.T) {
	fixture, err := os.ReadFile("../../lexicons/testdata/valid/computer.socialweb.infra.json")
	if err != nil {
		t.Fatal(err)
	}
	eFixture, err := os.ReadFile("../../lexicons/testdata/valid/computer.socialweb.ephemeralInfra.json")
	if err != nil {
		t.Fatal(err)
	}
	const infraHead = `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z",`
	tests := []struct {
		name   string
		kind   Kind
		in     string
		want   Declaration
		reason InvalidReason
	}{
		{name: "fixture", kind: KindInfra, in: string(fixture), want: Declaration{
			Description: "build farm",
			Contracts: []v1alpha1.InfraContract{{
				Name: "builder", State: v1alpha1.ContractRequested, VMName: "builder-0", ComputeKind: v1alpha1.ComputeKindDeno,
				UserData: "console.log('hi')", BidderDids: []string{"did:plc:ewvi7nxzyoun6zhxrhs64oiz"},
				DenyBidderDids: []string{"did:web:bad.example.com"}, SSHAuthorizedKeys: []string{"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG owner@laptop"},
				Policy: "lowest-cost", RequireIsolation: v1alpha1.IsolationVM, PolicyArgs: map[string]string{"maxCost": "10"}, VMReadyTimeoutSec: i32(300),
			}, {
				Name: "old", State: v1alpha1.ContractReleased, ReleaseRequestedAt: mtime(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)),
			}},
		}},
		{name: "ephemeral fixture", kind: KindEphemeralInfra, in: string(eFixture), want: Declaration{
			Description: "one CI run",
			Contracts:   []v1alpha1.InfraContract{{Name: "job", State: v1alpha1.ContractRequested, ComputeKind: v1alpha1.ComputeKindVM}},
		}},
		{name: "empty declaration", kind: KindInfra, in: `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z"}`},
		{name: "datetime cut to seconds", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"released","releaseRequestedAt":"2026-11-30T12:00:00.999+01:00"}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractReleased, ReleaseRequestedAt: mtime(time.Date(2026, 11, 30, 11, 0, 0, 0, time.UTC))}}}},
		{name: "policyArgs scalars", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","policyArgs":{"s":"x","b":true,"n":null,"f":1.5}}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractStaged, PolicyArgs: map[string]string{"s": "x", "b": "true", "n": "", "f": "1.5"}}}}},
		{name: "ports", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","ports":[{"name":"http","port":8080},{"name":"ssh","port":22}]}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractStaged, Ports: []v1alpha1.ContractPort{{Name: "http", Port: 8080}, {Name: "ssh", Port: 22}}}}}},
		{name: "size", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","cpus":2,"memMiB":1536}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractStaged, CPUs: 2, MemMiB: 1536}}}},
		{name: "no CPUs", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","cpus":0}]}`, reason: InvalidBadField},
		{name: "too little memory", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","memMiB":63}]}`, reason: InvalidBadField},
		{name: "duplicate port names", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","ports":[{"name":"http","port":80},{"name":"http","port":81}]}]}`, reason: InvalidBadField},
		{name: "port out of range", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","ports":[{"name":"http","port":70000}]}]}`, reason: InvalidBadField},
		{name: "port name not a label", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","ports":[{"name":"HTTP","port":80}]}]}`, reason: InvalidBadField},
		{name: "not json", kind: KindInfra, in: `{`, reason: InvalidMalformed},
		{name: "not an object", kind: KindInfra, in: `[1]`, reason: InvalidMalformed},
		{name: "no $type", kind: KindInfra, in: `{"createdAt":"2026-11-30T11:00:00Z"}`, reason: InvalidBadType},
		{name: "other collection", kind: KindInfra, in: `{"$type":"computer.socialweb.ephemeralInfra","createdAt":"2026-11-30T11:00:00Z"}`, reason: InvalidBadType},
		{name: "ephemeral wants its own type", kind: KindEphemeralInfra, in: `{"$type":"computer.socialweb.infra","createdAt":"2026-11-30T11:00:00Z"}`, reason: InvalidBadType},
		{name: "index", kind: KindInfra, in: infraHead + `"index":{"updatedAt":"2026-11-30T11:00:00Z"}}`, reason: InvalidIndex},
		{name: "wrong field type", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":1}]}`, reason: InvalidMalformed},
		{name: "contract without name", kind: KindInfra, in: infraHead + `"contracts":[{"state":"staged"}]}`, reason: InvalidMissingName},
		{name: "contract name not a label", kind: KindInfra, in: infraHead + `"contracts":[{"name":"Web_1","state":"staged"}]}`, reason: InvalidBadName},
		{name: "duplicate names", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged"},{"name":"a","state":"requested"}]}`, reason: InvalidDuplicateName},
		{name: "unknown state", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"running"}]}`, reason: InvalidUnknownState},
		{name: "API word for state", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"Staged"}]}`, reason: InvalidUnknownState},
		{name: "unknown compute kind", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","computeKind":"gpu"}]}`, reason: InvalidBadField},
		{name: "unknown isolation requirement", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireIsolation":"process"}]}`, reason: InvalidBadField},
		{name: "a required layer is named", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireLayers":["pod-user-namespaces"]}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractStaged, RequireLayers: []string{"pod-user-namespaces"}}}}},
		{name: "a required architecture", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireArch":"arm64"}]}`,
			want: Declaration{Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractStaged, RequireArch: "arm64"}}}},
		{name: "a required architecture that is no name", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireArch":"x86_64"}]}`, reason: InvalidBadField},
		{name: "a required layer that is no name", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireLayers":["Pod User"]}]}`, reason: InvalidBadField},
		{name: "a required layer twice", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","requireLayers":["seccomp","seccomp"]}]}`, reason: InvalidBadField},
		{name: "timeout out of range", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","vmReadyTimeoutSec":0}]}`, reason: InvalidBadField},
		{name: "bad datetime", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"released","releaseRequestedAt":"yesterday"}]}`, reason: InvalidBadField},
		{name: "nested policyArgs", kind: KindInfra, in: infraHead + `"contracts":[{"name":"a","state":"staged","policyArgs":{"x":{"y":1}}}]}`, reason: InvalidBadField},
		{name: "description too long", kind: KindInfra, in: infraHead + `"description":"` + strings.Repeat("x", 3001) + `"}`, reason: InvalidBadField},
		{name: "description over 300 characters", kind: KindInfra, in: infraHead + `"description":"` + strings.Repeat("x", 301) + `"}`, reason: InvalidBadField},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DeclarationFromRecord(tc.kind, []byte(tc.in))
			if tc.reason != "" {
				var ie *InvalidRecordError
				if !errors.As(err, &ie) || ie.Reason != tc.reason {
					t.Fatalf("err = %v; want reason %s", err, tc.reason)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("declaration (-want +got):\n%s", d)
			}
		})
	}
}

func TestHash(t *testing.T) {
	base := Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{
		{Name: "a", State: v1alpha1.ContractStaged, ComputeKind: v1alpha1.ComputeKindVM},
		{Name: "b", State: v1alpha1.ContractRequested, BidderDids: []string{"did:plc:x"}},
	}}
	tests := []struct {
		name  string
		other Declaration
		equal bool
	}{
		{name: "same", other: base, equal: true},
		{name: "defaults left out", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{
			{Name: "a"}, {Name: "b", State: v1alpha1.ContractRequested, ComputeKind: v1alpha1.ComputeKindVM, BidderDids: []string{"did:plc:x"}},
		}}, equal: true},
		{name: "contracts reordered", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{base.Contracts[1], base.Contracts[0]}}, equal: true},
		{name: "empty lists and maps are absent", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{
			{Name: "a", DenyBidderDids: []string{}, PolicyArgs: map[string]string{}}, base.Contracts[1],
		}}, equal: true},
		{name: "description edited", other: Declaration{Description: "e", Contracts: base.Contracts}},
		{name: "state edited", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractRequested}, base.Contracts[1]}}},
		{name: "kind edited", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{{Name: "a", ComputeKind: v1alpha1.ComputeKindDeno}, base.Contracts[1]}}},
		{name: "contract dropped", other: Declaration{Description: "d", Contracts: base.Contracts[:1]}},
		{name: "bidder order matters", other: Declaration{Description: "d", Contracts: []v1alpha1.InfraContract{base.Contracts[0],
			{Name: "b", State: v1alpha1.ContractRequested, BidderDids: []string{"did:plc:x", "did:plc:y"}}}}},
	}
	h := Hash(base)
	if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Fatalf("hash %q is not sha256 hex", h)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hash(tc.other) == h; got != tc.equal {
				t.Errorf("equal = %v; want %v\nbase  %s\nother %s", got, tc.equal, CanonicalJSON(base), CanonicalJSON(tc.other))
			}
		})
	}
}

func TestCanonicalJSON(t *testing.T) {
	d := Declaration{Description: "<x>", Contracts: []v1alpha1.InfraContract{{Name: "z", PolicyArgs: map[string]string{"b": "1", "a": "2"}, RequireIsolation: v1alpha1.IsolationVM, RequireArch: "arm64", VMReadyTimeoutSec: i32(5)}, {Name: "a"}}}
	want := `{"contracts":[{"computeKind":"vm","name":"a","state":"staged"},{"computeKind":"vm","name":"z","policyArgs":{"a":"2","b":"1"},"requireArch":"arm64","requireIsolation":"vm","state":"staged","vmReadyTimeoutSec":5}],"description":"<x>"}`
	if d := cmp.Diff(want, string(CanonicalJSON(d))); d != "" {
		t.Error(d)
	}
}

// randomDeclaration draws a declaration from a small vocabulary, so that edits collide often.
func randomDeclaration(r *rand.Rand) Declaration {
	pick := func(s ...string) string { return s[r.Intn(len(s))] }
	d := Declaration{Description: pick("", "web", "build farm", "ünïcode")}
	names := []string{"a", "b", "web", "db"}
	r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	for _, n := range names[:r.Intn(len(names)+1)] {
		c := v1alpha1.InfraContract{Name: n,
			State:       v1alpha1.ContractState(pick("", "Staged", "Requested", "Released")),
			ComputeKind: v1alpha1.ComputeKind(pick("", "vm", "deno")),
			UserData:    pick("", "#cloud-config\n"),
			Policy:      pick("", "lowest-cost"),
		}
		// By name, not drawn from r: the sync property test replays this stream.
		c.RequireIsolation = map[string]v1alpha1.IsolationBoundary{"web": v1alpha1.IsolationVM, "db": v1alpha1.IsolationNamespace}[n]
		c.RequireLayers = map[string][]string{"web": {"pod-user-namespaces"}, "db": {"seccomp", "cgroup-limits"}}[n]
		c.RequireArch = map[string]string{"db": "arm64"}[n]
		if r.Intn(3) == 0 {
			c.BidderDids = []string{pick("did:plc:a", "did:web:b.example")}
		}
		if r.Intn(3) == 0 {
			c.PolicyArgs = map[string]string{pick("x", "y"): pick("1", "true", "s")}
		}
		if r.Intn(3) == 0 {
			c.VMReadyTimeoutSec = i32(int32(1 + r.Intn(600)))
		}
		if r.Intn(3) == 0 {
			c.Ports = []v1alpha1.ContractPort{{Name: "http", Port: int32(1 + r.Intn(65535))}}
			if r.Intn(2) == 0 {
				c.Ports = append(c.Ports, v1alpha1.ContractPort{Name: pick("api", "ssh"), Port: 22})
			}
		}
		if r.Intn(4) == 0 {
			c.ReleaseRequestedAt = mtime(t0.Add(time.Duration(r.Intn(1000)) * time.Second))
		}

		d.Contracts = append(d.Contracts, c)
	}
	return d
}

// A declaration written to a record and read back hashes the same: a round trip is never an edit.
func TestHashSurvivesRecordRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(29))
	for i := 0; i < 2000; i++ {
		d := randomDeclaration(r)
		// Sizes from i, not r: the draws of randomDeclaration stay those of the other tests.
		for j := range d.Contracts {
			if (i+j)%3 == 0 {
				d.Contracts[j].CPUs, d.Contracts[j].MemMiB = int32(1+(i+j)%8), int32(64+(i*7+j)%8192)
			}
		}
		for _, kind := range []Kind{KindInfra, KindEphemeralInfra} {
			rec, err := RenderRecord(kind, metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)},
				v1alpha1.EphemeralInfraSpec{InfraSpec: v1alpha1.InfraSpec{Description: d.Description, Contracts: d.Contracts}},
				v1alpha1.EphemeralInfraStatus{}, t0)
			if err != nil {
				t.Fatalf("render %+v: %v", d, err)
			}
			b, err := rec.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			back, err := DeclarationFromRecord(kind, b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if Hash(back) != Hash(d) {
				t.Fatalf("round trip changed the hash\nin  %s\nout %s", CanonicalJSON(d), CanonicalJSON(back))
			}
		}
	}
}

func TestStateMapping(t *testing.T) {
	tests := []struct {
		name string
		in   v1alpha1.ContractState
		want string
	}{
		{"default", "", "staged"},
		{"staged", v1alpha1.ContractStaged, "staged"},
		{"requested", v1alpha1.ContractRequested, "requested"},
		{"released", v1alpha1.ContractReleased, "released"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := StateToRecord(tc.in)
			if got != tc.want {
				t.Fatalf("StateToRecord(%q) = %q; want %q", tc.in, got, tc.want)
			}
			back, ok := StateFromRecord(got)
			want := tc.in
			if want == "" {
				want = v1alpha1.ContractStaged
			}
			if !ok || back != want {
				t.Fatalf("StateFromRecord(%q) = %q, %v", got, back, ok)
			}
		})
	}
	if _, ok := StateFromRecord("Requested"); ok {
		t.Error("the API word is not a record state")
	}
}

func TestPhaseMapping(t *testing.T) {
	for _, p := range contractPhases {
		back, ok := ContractPhaseFromRecord(ContractPhaseToRecord(p))
		if !ok || back != p || ContractPhaseToRecord(p) != strings.ToLower(string(p)) {
			t.Errorf("contract phase %s -> %s -> %s", p, ContractPhaseToRecord(p), back)
		}
	}
	for _, p := range infraPhases {
		back, ok := PhaseFromRecord(PhaseToRecord(p))
		if !ok || back != p {
			t.Errorf("phase %s -> %s -> %s", p, PhaseToRecord(p), back)
		}
	}
	if _, ok := PhaseFromRecord("running"); ok {
		t.Error("unknown phase accepted")
	}
	if _, ok := ContractPhaseFromRecord("held"); ok {
		t.Error("unknown contract phase accepted")
	}
}
