package infra

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
)

func sp(s string) *string { return &s }

func TestRenderRecord(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "web", CreationTimestamp: metav1.NewTime(t0)}
	deleted := meta
	deleted.DeletionTimestamp = mtime(t0.Add(time.Hour))
	spec := v1alpha1.EphemeralInfraSpec{InfraSpec: v1alpha1.InfraSpec{
		Description: "web tier",
		Contracts:   []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractRequested}},
	}}
	status := v1alpha1.EphemeralInfraStatus{InfraStatus: v1alpha1.InfraStatus{
		Phase: v1alpha1.InfraDeployed,
		Contracts: []v1alpha1.InfraContractStatus{{Name: "a", Phase: v1alpha1.InfraContractDeployed, Winner: "did:plc:w",
			Receipt: "at://did:plc:w/com.publicdomainrelay.temp.market.receipt/3k", ComputeContract: "infra-web-a", Message: "running"}},
	}}
	wantContracts := []atinfra.InfraContract{{Name: "a", State: "requested"}}
	wantStatusContracts := []atinfra.InfraContractStatus{{Name: "a", Phase: sp("deployed"), Winner: sp("did:plc:w"),
		Receipt: sp("at://did:plc:w/com.publicdomainrelay.temp.market.receipt/3k"), Message: sp("running")}}
	ended := status
	ended.EndedAt, ended.EndReason, ended.Phase = mtime(t0.Add(30*time.Minute)), EndReasonDeadline, v1alpha1.InfraEnding
	ended.ExpiresAt = mtime(t0.Add(30 * time.Minute))
	tests := []struct {
		name   string
		kind   Kind
		meta   metav1.ObjectMeta
		spec   v1alpha1.EphemeralInfraSpec
		status v1alpha1.EphemeralInfraStatus
		want   Rendered
	}{
		{name: "infra", kind: KindInfra, meta: meta, spec: spec, status: status, want: Rendered{Infra: &atinfra.Infra{
			Contracts: wantContracts, CreatedAt: "2026-11-30T11:00:00Z", Description: sp("web tier"),
			Status: &atinfra.InfraStatus{Phase: sp("deployed"), Contracts: wantStatusContracts},
		}}},
		{name: "unreconciled is pending", kind: KindInfra, meta: meta, want: Rendered{Infra: &atinfra.Infra{
			CreatedAt: "2026-11-30T11:00:00Z", Status: &atinfra.InfraStatus{Phase: sp("pending")},
		}}},
		{name: "no creationTimestamp yet uses now", kind: KindInfra, want: Rendered{Infra: &atinfra.Infra{
			CreatedAt: "2026-11-30T11:05:00Z", Status: &atinfra.InfraStatus{Phase: sp("pending")},
		}}},
		{name: "final write of a deleted infra", kind: KindInfra, meta: deleted, spec: spec, status: status, want: Rendered{Infra: &atinfra.Infra{
			Contracts: wantContracts, CreatedAt: "2026-11-30T11:00:00Z", Description: sp("web tier"),
			Status: &atinfra.InfraStatus{Phase: sp("ended"), EndedAt: sp("2026-11-30T12:00:00Z"), EndReason: sp("deleted"), Contracts: wantStatusContracts},
		}}},
		{name: "ephemeral with defaults", kind: KindEphemeralInfra, meta: meta, spec: spec, status: status, want: Rendered{EphemeralInfra: &atinfra.EphemeralInfra{
			Contracts: wantContracts, CreatedAt: "2026-11-30T11:00:00Z", Description: sp("web tier"), TTLSeconds: 3600, EndWhen: sp("complete"),
			Status: &atinfra.InfraStatus{Phase: sp("deployed"), Contracts: wantStatusContracts},
		}}},
		{name: "ended ephemeral keeps its end when deleted", kind: KindEphemeralInfra, meta: deleted,
			spec:   v1alpha1.EphemeralInfraSpec{TTLSeconds: 1800, EndWhen: v1alpha1.EndWhenDeadline},
			status: ended, want: Rendered{EphemeralInfra: &atinfra.EphemeralInfra{
				CreatedAt: "2026-11-30T11:00:00Z", TTLSeconds: 1800, EndWhen: sp("deadline"),
				Status: &atinfra.InfraStatus{Phase: sp("ended"), EndedAt: sp("2026-11-30T11:30:00Z"), EndReason: sp("deadline"),
					ExpiresAt: sp("2026-11-30T11:30:00Z"), Contracts: wantStatusContracts},
			}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := RenderRecord(tc.kind, tc.meta, tc.spec, tc.status, t0.Add(5*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("record (-want +got):\n%s", d)
			}
			if got.Collection() != tc.kind.Collection() {
				t.Errorf("collection %s", got.Collection())
			}
		})
	}
}

// Secrets, nodes, clusterRef and the binding are kcp-only: no part of them reaches a record.
func TestRenderRecordNeverPublishesKcpOnlyFields(t *testing.T) {
	spec := v1alpha1.EphemeralInfraSpec{InfraSpec: v1alpha1.InfraSpec{
		Contracts: []v1alpha1.InfraContract{{Name: "a", State: v1alpha1.ContractRequested}},
		Secrets:   []v1alpha1.InfraContractSecret{{Contract: "a", SecretRef: v1alpha1.SecretKeyRef{Name: "leak-secret-name", Key: "leak-secret-key"}}},
		Nodes: []v1alpha1.InfraContractNode{{Contract: "a", OwnerDid: "did:plc:leakowner", Adopt: true,
			NodeJoin:     &v1alpha1.NodeJoin{Server: "https://leak-server", BundleSecretRef: &v1alpha1.SecretKeyRef{Name: "leak-bundle"}},
			NodeClaimRef: &v1alpha1.ObjectRef{Name: "leak-claim"}}},
		ClusterRef: &v1alpha1.ObjectRef{Name: "leak-cluster"},
		Record:     &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "leak-repo"}, URI: "at://did:plc:leakuri/x.y.z/r"},
	}}
	for _, kind := range []Kind{KindInfra, KindEphemeralInfra} {
		rec, err := RenderRecord(kind, metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)}, spec, v1alpha1.EphemeralInfraStatus{}, t0)
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []string{"leak", "secret", "nodeJoin", "ownerDid", "cluster", "repoRef"} {
			if strings.Contains(strings.ToLower(string(b)), strings.ToLower(w)) {
				t.Errorf("%s record carries %q: %s", kind, w, b)
			}
		}
		if !strings.Contains(string(b), `"$type":"`+kind.Collection()+`"`) {
			t.Errorf("record has no $type: %s", b)
		}
	}
}

func TestRenderRecordRefusesWhatTheLexiconRefuses(t *testing.T) {
	spec := v1alpha1.EphemeralInfraSpec{InfraSpec: v1alpha1.InfraSpec{Description: strings.Repeat("é", 400)}}
	if _, err := RenderRecord(KindInfra, metav1.ObjectMeta{}, spec, v1alpha1.EphemeralInfraStatus{}, t0); err == nil {
		t.Error("a description over 300 graphemes rendered without error")
	}
}

func TestTruncateMessage(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"short", "ok", "ok"},
		{"graphemes", strings.Repeat("x", 1100), strings.Repeat("x", 1024)},
		{"bytes on a rune boundary", strings.Repeat("€", 1500), strings.Repeat("€", 1024)},
		{"bytes", strings.Repeat("😀", 1100), strings.Repeat("😀", 1024)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := truncateMessage(tc.in)
			if got != tc.want || len(got) > maxMessageBytes {
				t.Errorf("len %d; want %d", len(got), len(tc.want))
			}
		})
	}
}

func TestStatusWriteDue(t *testing.T) {
	st := func(phase string, cphase string, msg string) *atinfra.InfraStatus {
		return &atinfra.InfraStatus{Phase: sp(phase), Contracts: []atinfra.InfraContractStatus{{Name: "a", Phase: sp(cphase), Message: ptrIf(msg)}}}
	}
	last := t0
	tests := []struct {
		name       string
		prev, next *atinfra.InfraStatus
		now        time.Time
		want       bool
	}{
		{"never written", nil, st("staged", "staged", ""), last, true},
		{"unchanged", st("deploying", "requesting", "x"), st("deploying", "requesting", "x"), last.Add(time.Hour), false},
		{"message within a minute", st("deploying", "requesting", "x"), st("deploying", "requesting", "y"), last.Add(59 * time.Second), false},
		{"message after a minute", st("deploying", "requesting", "x"), st("deploying", "requesting", "y"), last.Add(time.Minute), true},
		{"phase change at once", st("deploying", "requesting", "x"), st("deployed", "deployed", "x"), last.Add(time.Second), true},
		{"contract phase change at once", st("deploying", "requesting", ""), st("deploying", "deployed", ""), last.Add(time.Second), true},
		{"end at once", st("ending", "released", ""), &atinfra.InfraStatus{Phase: sp("ending"), EndedAt: sp("2026-11-30T11:00:00Z"),
			Contracts: []atinfra.InfraContractStatus{{Name: "a", Phase: sp("released")}}}, last, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := StatusWriteDue(tc.prev, tc.next, last, tc.now); got != tc.want {
				t.Errorf("StatusWriteDue = %v; want %v", got, tc.want)
			}
		})
	}
}
