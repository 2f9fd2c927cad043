package cluster

import (
	"encoding/json"
	"testing"

	"socialweb.computer/internal/atproto/lextest"
)

// The gateway's inputs and outputs have no $type; they round-trip as plain JSON.
func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		json string
		v    any
	}{
		{"createCluster input", `{"name":"dev"}`, new(CreateClusterInput)},
		{"createCluster output", `{"phase":"Initializing"}`, new(CreateClusterOutput)},
		{"getKubeconfig input", `{"name":"dev","ttlSeconds":600,"noExpiry":false}`, new(GetKubeconfigInput)},
		{"getKubeconfig output", `{"kubeconfig":"apiVersion: v1\n","instance":"i-1"}`, new(GetKubeconfigOutput)},
		{"listClusters output", `{"clusters":[{"name":"dev","phase":"Ready","running":true,"instance":"i-1","teardownBlocked":false,"server":"https://127.0.0.1:6443"}]}`, new(ListClustersOutput)},
		{"listClusters empty", `{"clusters":[]}`, new(ListClustersOutput)},
		{"controlPlaneUp", `{"name":"dev"}`, new(ControlPlaneUpInput)},
		{"controlPlaneDown", `{"phase":"Unavailable"}`, new(ControlPlaneDownOutput)},
		{"deleteCluster", `{"phase":"Draining"}`, new(DeleteClusterOutput)},
		{"revokeIdentity input", `{"did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","name":"dev"}`, new(RevokeIdentityInput)},
		{"revokeIdentity output", `{"revoked":[{"name":"sa-1","state":"Revoked"}]}`, new(RevokeIdentityOutput)},
		{"setPublishInfra", `{"name":"dev","publish":true}`, new(SetPublishInfraInput)},
		{"kubectlApplyServerSide input", `{"cluster":"dev","manifest":{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"hi"}},"fieldManager":"socialweb-computer","force":true,"dryRun":false}`, new(KubectlApplyServerSideInput)},
		{"kubectlApplyServerSide output", `{"apiVersion":"batch/v1","kind":"Job","name":"hi","uid":"u-1","resourceVersion":"42","generation":1,"object":{"kind":"Job"}}`, new(KubectlApplyServerSideOutput)},
		{"getJob output", `{"phase":"Succeeded","counts":{"active":0,"succeeded":1,"failed":0},"conditions":[{"type":"Complete","status":"True","lastTransitionTime":"2026-11-30T11:00:00Z"}],"pods":[{"name":"hi-x","phase":"Succeeded","containers":[{"name":"main","log":"hello\n"}]}]}`, new(GetJobOutput)},
		{"subscribe cluster frame", `{"$type":"com.publicdomainrelay.temp.cluster.subscribeClusters#cluster","name":"dev","phase":"Ready","running":true}`, new(SubscribeClustersMessage)},
		{"subscribe member frame", `{"$type":"com.publicdomainrelay.temp.cluster.subscribeClusters#member","cluster":"dev","did":"did:plc:ewvi7nxzyoun6zhxrhs64oiz","state":"Granted"}`, new(SubscribeClustersMessage)},
		{"subscribe nodeClaim frame", `{"$type":"com.publicdomainrelay.temp.cluster.subscribeClusters#nodeClaim","cluster":"dev","name":"nc-1","phase":"Joined","nodeName":"n1"}`, new(SubscribeClustersMessage)},
		{"subscribe info frame", `{"$type":"com.publicdomainrelay.temp.cluster.subscribeClusters#info","name":"SnapshotComplete"}`, new(SubscribeClustersMessage)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lextest.RoundTrip(t, []byte(tc.json), tc.v)
		})
	}
}

func TestSubscribeMessage(t *testing.T) {
	var m SubscribeClustersMessage
	if err := json.Unmarshal([]byte(`{"$type":"com.publicdomainrelay.temp.cluster.subscribeClusters#info","name":"SnapshotComplete"}`), &m); err != nil {
		t.Fatal(err)
	}
	if m.SubscribeClustersInfo == nil || m.SubscribeClustersInfo.Name != SubscribeClustersInfoNameSnapshotComplete {
		t.Fatalf("%+v", m)
	}
	if GetJobParamsTailLinesDefault != 100 || GetKubeconfigInputTTLSecondsDefault != 28800 || KubectlApplyServerSideInputFieldManagerDefault != "socialweb-computer" {
		t.Fatal("defaults")
	}
	if GetJobNSID != "computer.socialweb.k8s.getJob" || SubscribeClustersNSID != "com.publicdomainrelay.temp.cluster.subscribeClusters" {
		t.Fatal("NSIDs")
	}
}
