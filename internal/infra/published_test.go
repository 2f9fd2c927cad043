package infra

import (
	"encoding/json"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
)

// A cluster Infra published with sync Publish shows each entry's name, state, vmName and
// bidderDids and the observed phases and winners; nothing of spec.nodes, spec.secrets,
// spec.clusterRef or spec.record, and none of userData, policy, policyArgs,
// sshAuthorizedKeys, vmReadyTimeoutSec or a contract's status message. The test fails if any
// of them reaches the rendered record.
func TestPublishedRecordShowsTheNodesAndLeaksNothing(t *testing.T) {
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
	timeout := int32(77)
	for i := range spec.Contracts {
		k := &spec.Contracts[i]
		k.BidderDids = []string{"did:plc:bidder"}
		k.UserData, k.Policy, k.PolicyArgs = "leak-userdata", "leak-policy", map[string]string{"leakarg": "leakvalue"}
		k.SSHAuthorizedKeys, k.VMReadyTimeoutSec = []string{"ssh-ed25519 leakkey"}, &timeout
	}
	spec.Record = ClusterRecordBinding(&v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Account: "did:plc:leakaccount", PublishInfra: true}})
	status := v1alpha1.EphemeralInfraStatus{InfraStatus: v1alpha1.InfraStatus{Phase: v1alpha1.InfraDeployed,
		Contracts: []v1alpha1.InfraContractStatus{{Name: NodeEntryName("u1"), Phase: v1alpha1.InfraContractDeployed, Winner: "did:plc:winner",
			ComputeContract: "leak-computecontract", Message: "leak message from 10.0.0.1"}}}}

	rec, err := RenderRecord(KindInfra, metav1.ObjectMeta{CreationTimestamp: metav1.NewTime(t0)},
		v1alpha1.EphemeralInfraSpec{InfraSpec: PublishedSpec(spec)}, PublishedStatus(status), t0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"leak", "nodeJoin", "ownerDid", "nodeClaimRef", "adopt", "secret", "clusterRef", "bundle",
		"userData", "policy", "sshAuthorizedKeys", "vmReadyTimeoutSec", "message", "repoRef", "computeContract", "did:plc:leakaccount"} {
		if strings.Contains(strings.ToLower(string(b)), strings.ToLower(w)) {
			t.Errorf("record carries %q: %s", w, b)
		}
	}
	for _, w := range []string{NodeEntryName("u1"), NodeEntryName("u2"), `"vmName":"vm-u1"`, `"state":"requested"`,
		`"bidderDids":["did:plc:bidder"]`, `"computeKind":"node"`, `"phase":"deployed"`, `"winner":"did:plc:winner"`} {
		if !strings.Contains(string(b), w) {
			t.Errorf("record lacks %s: %s", w, b)
		}
	}
	// The hash of a Publish binding compares the projection: the record read back is in sync.
	got, err := DeclarationFromRecord(KindInfra, b)
	if err != nil {
		t.Fatal(err)
	}
	if Hash(got) != Hash(DeclarationFromSpec(PublishedSpec(spec))) {
		t.Errorf("the published record does not hash as the projection of the spec")
	}
	if Hash(got) == Hash(DeclarationFromSpec(spec)) {
		t.Errorf("the projection hashes as the whole spec: the test spec has nothing to project away")
	}
	// The projection leaves the spec it was given alone (the contracts still get their inputs).
	if spec.Contracts[0].UserData != "leak-userdata" || spec.Contracts[0].VMReadyTimeoutSec == nil || status.Contracts[0].Message == "" {
		t.Errorf("PublishedSpec or PublishedStatus changed its input")
	}
}

func TestClusterRecordBinding(t *testing.T) {
	c := &v1alpha1.Cluster{Spec: v1alpha1.ClusterSpec{Account: "did:plc:owner"}}
	if b := ClusterRecordBinding(c); b != nil {
		t.Errorf("publishInfra false: %+v, want no binding", b)
	}
	c.Spec.PublishInfra = true
	b := ClusterRecordBinding(c)
	if b == nil || b.RepoRef.Name != OwnerRepoName("did:plc:owner") || b.RepoRef.Namespace != "" || b.Sync != v1alpha1.RecordSyncPublish || b.URI != "" {
		t.Errorf("publishInfra true: %+v, want the owner's repo with sync Publish", b)
	}
	if OwnerRepoName("did:plc:owner") == OwnerRepoName("did:plc:other") || len(OwnerRepoName("did:plc:owner")) != len("owner-")+16 {
		t.Errorf("OwnerRepoName %q", OwnerRepoName("did:plc:owner"))
	}
	now := metav1.Now()
	c.DeletionTimestamp = &now
	if b := ClusterRecordBinding(c); b != nil {
		t.Errorf("deleting cluster: %+v, want no binding", b)
	}
	if ClusterRecordBinding(nil) != nil {
		t.Errorf("nil cluster has a binding")
	}
}
