package workspace

import (
	"reflect"
	"strings"
	"testing"

	"socialweb.computer/internal/controllers/manager"
)

func TestNext(t *testing.T) {
	for _, tc := range []struct {
		name string
		left map[string]Count
		want Plan
	}{
		{"empty", nil, Plan{Step: StepDone}},
		{"zero counts", map[string]Count{KindInfra: {}, KindSecret: {}}, Plan{Step: StepDone}},
		{"deployments first, with their composers",
			map[string]Count{KindInfra: {Total: 2}, KindEphemeralInfra: {Total: 1}, KindInfraCollection: {Total: 1},
				KindComputeContract: {Total: 3}, KindAtprotoRepo: {Total: 1}, KindSecret: {Total: 1}, "AtprotoRecord": {Total: 2}},
			Plan{Step: StepDeployments, Delete: []string{KindInfra, KindEphemeralInfra, KindInfraCollection},
				WaitFor: []string{KindInfra, KindEphemeralInfra}, Progress: "3 deployment(s) releasing"}},
		{"deployments already deleting are not deleted again",
			map[string]Count{KindInfra: {Total: 1, Deleting: 1}, KindComputeContract: {Total: 1}},
			Plan{Step: StepDeployments, WaitFor: []string{KindInfra, KindEphemeralInfra}, Progress: "1 deployment(s) releasing"}},
		{"contracts once no deployment is left",
			map[string]Count{KindComputeContract: {Total: 2}, KindCluster: {Total: 1, Deleting: 1}, KindAtprotoRepo: {Total: 1}},
			Plan{Step: StepContracts, Delete: []string{KindComputeContract}, WaitFor: []string{KindComputeContract},
				Progress: "2 contract(s) releasing"}},
		{"contracts deleting: wait",
			map[string]Count{KindComputeContract: {Total: 2, Deleting: 2}},
			Plan{Step: StepContracts, WaitFor: []string{KindComputeContract}, Progress: "2 contract(s) releasing"}},
		{"records before repos and secrets",
			map[string]Count{"AtprotoRecord": {Total: 1}, "AtprotoRecordWatch": {Total: 1}, KindCluster: {Total: 1, Deleting: 1},
				KindAtprotoRepo: {Total: 1}, KindSecret: {Total: 2}},
			Plan{Step: StepRecords, Delete: []string{"AtprotoRecord", "AtprotoRecordWatch", KindCluster},
				WaitFor: []string{"AtprotoRecord", "AtprotoRecordWatch", KindCluster}, Progress: "3 object(s) going: AtprotoRecord, AtprotoRecordWatch, Cluster"}},
		{"an unknown kind of the group is a record-step kind",
			map[string]Count{"Future": {Total: 1}, KindSecret: {Total: 1}},
			Plan{Step: StepRecords, Delete: []string{"Future"}, WaitFor: []string{"Future"}, Progress: "1 object(s) going: Future"}},
		{"repos and secrets last",
			map[string]Count{KindAtprotoRepo: {Total: 1}, KindSecret: {Total: 2, Deleting: 1}},
			Plan{Step: StepRepos, Delete: []string{KindAtprotoRepo, KindSecret}, WaitFor: []string{KindAtprotoRepo, KindSecret},
				Progress: "3 repo(s) and secret(s) going"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.left); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Next:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Every kind of the group is deleted by some step, and the order names only kinds that exist.
func TestKindsCovered(t *testing.T) {
	kinds := Kinds(manager.Scheme())
	if len(kinds) < 10 {
		t.Fatalf("kinds %v", kinds)
	}
	left := map[string]Count{}
	for _, k := range kinds {
		left[k] = Count{Total: 1}
	}
	for _, k := range append(append(deploymentKinds, composerKinds...), KindComputeContract, KindAtprotoRepo, KindSecret) {
		if _, ok := left[k]; !ok {
			t.Fatalf("the order names %s, which the scheme does not know (%v)", k, kinds)
		}
	}
	for i := 0; i < 10; i++ {
		p := Next(left)
		if p.Step == StepDone {
			return
		}
		for _, k := range p.Delete {
			delete(left, k)
		}
		for _, k := range p.WaitFor {
			delete(left, k)
		}
	}
	t.Fatalf("kinds never deleted: %v", left)
}

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{"default": true, "acct-abc123": true, "": false, "Bad_Name": false,
		"-x": false, strings.Repeat("a", 64): false, "a/b": false} {
		if err := CheckName(name); (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

func TestNextRoot(t *testing.T) {
	root := map[string]Count{KindInfra: {Total: 1}, KindComputeContract: {Total: 2}, KindSecret: {Total: 2}, KindAtprotoRepo: {Total: 1}}
	for _, tc := range []struct {
		name           string
		clusters, left map[string]Count
		want           Plan
	}{
		{"clusters and their claims first, whatever the root holds", map[string]Count{KindCluster: {Total: 2}, KindNodeClaim: {Total: 3, Deleting: 1}}, root,
			Plan{Step: StepClusters, Delete: []string{KindCluster, KindNodeClaim}, WaitFor: []string{KindCluster, KindNodeClaim},
				Progress: "2 cluster(s) and 3 node claim(s) going"}},
		{"claims still releasing their nodes: wait", map[string]Count{KindNodeClaim: {Total: 2, Deleting: 2}}, root,
			Plan{Step: StepClusters, WaitFor: []string{KindCluster, KindNodeClaim}, Progress: "0 cluster(s) and 2 node claim(s) going"}},
		{"then the deployments left", nil, root,
			Plan{Step: StepDeployments, Delete: []string{KindInfra}, WaitFor: []string{KindInfra, KindEphemeralInfra}, Progress: "1 deployment(s) releasing"}},
		{"then the contracts that still hold a guest", map[string]Count{KindCluster: {}}, map[string]Count{KindComputeContract: {Total: 1, Deleting: 1}, KindSecret: {Total: 1}},
			Plan{Step: StepContracts, WaitFor: []string{KindComputeContract}, Progress: "1 contract(s) releasing"}},
		{"then the rest, repos and secrets last", nil, map[string]Count{KindSecret: {Total: 1}},
			Plan{Step: StepRepos, Delete: []string{KindSecret}, WaitFor: []string{KindSecret}, Progress: "1 repo(s) and secret(s) going"}},
		{"done", nil, nil, Plan{Step: StepDone}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NextRoot(tc.clusters, tc.left); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("NextRoot:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
