// Package workspace deletes a workspace (a namespace, docs/ARCHITECTURE.md section 2) in the
// order its objects need: deployments first, so their finalizers release the contracts while
// the repos and secrets the release needs are still there; then the remaining contracts;
// then every other object of the group, the repos and secrets last.
package workspace

import (
	"fmt"
	"sort"
	"strings"
)

// Kinds of the socialweb.computer group the order names. Any other kind of the group is
// deleted in the records step.
const (
	KindInfra                    = "Infra"
	KindEphemeralInfra           = "EphemeralInfra"
	KindInfraCollection          = "InfraCollection"
	KindEphemeralInfraCollection = "EphemeralInfraCollection"
	KindCluster                  = "Cluster"
	KindNodeClaim                = "NodeClaim"
	KindComputeContract          = "ComputeContract"
	KindAtprotoRepo              = "AtprotoRepo"
	KindSecret                   = "Secret"
)

// Step names, in order.
const (
	// StepClusters is the first step of a gateway root's deletion (NextRoot) only.
	StepClusters    = "clusters"
	StepDeployments = "deployments"
	StepContracts   = "contracts"
	StepRecords     = "records"
	StepRepos       = "repos"
	StepDone        = "done"
)

// Count is what is left of one kind: objects present, and of those how many already have a
// deletion timestamp (waiting on a finalizer).
type Count struct {
	Total    int
	Deleting int
}

// Plan is the next step of a workspace deletion.
type Plan struct {
	// Step is the step under way (StepDone when nothing of ours is left).
	Step string
	// Delete are the kinds whose objects not yet deleting are deleted now.
	Delete []string
	// WaitFor are the kinds the step waits to be gone before the next step.
	WaitFor []string
	// Progress is the line to report while waiting.
	Progress string
}

// deployments are the kinds deleted in the first step: the deployments and the composers that
// would create a deployment again if they outlived it.
var deploymentKinds = []string{KindInfra, KindEphemeralInfra}
var composerKinds = []string{KindInfraCollection, KindEphemeralInfraCollection, KindCluster, KindNodeClaim}

// Next decides the next step from what is left, by kind. It is pure: the caller lists,
// applies Delete, reports Progress, and asks again.
//
//   - deployments: Infra and EphemeralInfra (and the collections, Clusters and NodeClaims that
//     compose them, which would otherwise make them again) are deleted; their finalizers
//     release their contracts. Waits until no Infra or EphemeralInfra is left:
//     "<n> deployment(s) releasing".
//   - contracts: the ComputeContracts left (not owned by a deployment, or left by one) are
//     deleted; their finalizer releases the guest. Waits until none is left.
//   - records: every other kind but AtprotoRepo and Secret (AtprotoRecord finalizers still
//     need the repo to delete their records). Waits until none is left.
//   - repos: AtprotoRepo and Secret. Waits until none is left.
func Next(left map[string]Count) Plan {
	total := func(kinds []string) (n int) {
		for _, k := range kinds {
			n += left[k].Total
		}
		return n
	}
	if n := total(deploymentKinds); n > 0 {
		return Plan{Step: StepDeployments, Delete: present(left, append(append([]string{}, deploymentKinds...), composerKinds...)),
			WaitFor: deploymentKinds, Progress: fmt.Sprintf("%d deployment(s) releasing", n)}
	}
	if n := left[KindComputeContract].Total; n > 0 {
		return Plan{Step: StepContracts, Delete: present(left, []string{KindComputeContract}),
			WaitFor: []string{KindComputeContract}, Progress: fmt.Sprintf("%d contract(s) releasing", n)}
	}
	var rest []string
	for k, c := range left {
		if c.Total > 0 && k != KindAtprotoRepo && k != KindSecret && k != KindComputeContract && !contains(deploymentKinds, k) {
			rest = append(rest, k)
		}
	}
	if len(rest) > 0 {
		sort.Strings(rest)
		return Plan{Step: StepRecords, Delete: rest, WaitFor: rest,
			Progress: fmt.Sprintf("%d object(s) going: %s", total(rest), strings.Join(rest, ", "))}
	}
	if n := total([]string{KindAtprotoRepo, KindSecret}); n > 0 {
		kinds := present(left, []string{KindAtprotoRepo, KindSecret})
		return Plan{Step: StepRepos, Delete: kinds, WaitFor: kinds,
			Progress: fmt.Sprintf("%d repo(s) and secret(s) going", n)}
	}
	return Plan{Step: StepDone}
}

// present keeps the kinds with objects not yet deleting.
func present(left map[string]Count, kinds []string) []string {
	var out []string
	for _, k := range kinds {
		if c := left[k]; c.Total > c.Deleting {
			out = append(out, k)
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// rootKinds are the kinds a gateway root's deletion deletes in every workspace before its
// own: the Clusters the gateway serves and their NodeClaims, which compose the root's node
// Infras and would write them again.
var rootKinds = []string{KindCluster, KindNodeClaim}

// NextRoot decides the next step of deleting a gateway root, the workspace that holds the
// gateway's deployments (the node Infras of every Cluster, their contracts, join bundles and
// requester repo; docs/nodes.md). clusters counts the Clusters and NodeClaims of every
// workspace, left what is left of the root's own. It is pure, like Next.
//
//   - clusters: every Cluster and NodeClaim is deleted; waits until none is left:
//     "<n> cluster(s) and <m> node claim(s) going". A deleted Cluster has its claims
//     deleted and its node Infra deleted; a claim goes once its node is released.
//   - then Next on the root: any deployment left ("<n> deployment(s) releasing"), then the
//     contracts, waiting while a ComputeContract still holds a guest, then the rest.
func NextRoot(clusters, left map[string]Count) Plan {
	if n, m := clusters[KindCluster].Total, clusters[KindNodeClaim].Total; n+m > 0 {
		return Plan{Step: StepClusters, Delete: present(clusters, rootKinds), WaitFor: rootKinds,
			Progress: fmt.Sprintf("%d cluster(s) and %d node claim(s) going", n, m)}
	}
	return Next(left)
}
