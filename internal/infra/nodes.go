package infra

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

	"socialweb.computer/api/v1alpha1"
)

// A tenant cluster's nodes are one deployment: one Infra per Cluster (ClusterInfraName), one
// contract entry per NodeClaim (NodeEntryName). The NodeClaim controller composes it with
// the functions below and is the only writer of its spec.

// ClusterInfraName is the name of the Infra that holds the nodes of the Cluster named
// cluster in the namespace (workspace) home: nodes-<20 hex of sha256(home/cluster)>.
func ClusterInfraName(home, cluster string) string {
	sum := sha256.Sum256([]byte(home + "/" + cluster))
	return "nodes-" + hex.EncodeToString(sum[:])[:20]
}

// NodeEntryName is the contract entry of the NodeClaim with uid: node-<12 hex of
// sha256(uid)>. A claim recreated under the same name gets a new entry.
func NodeEntryName(claimUID string) string {
	sum := sha256.Sum256([]byte(claimUID))
	return "node-" + hex.EncodeToString(sum[:])[:12]
}

// NodeBundleSecretName is the Secret (in the Infra's namespace) that holds the join bundle
// of an entry: the entry's ComputeContract name plus -join.
func NodeBundleSecretName(infraName, entry string) string {
	return ContractName(KindInfra, infraName, entry) + "-join"
}

// NodeEntry is what one NodeClaim declares in its cluster's Infra.
type NodeEntry struct {
	// Name is the contract entry (NodeEntryName).
	Name  string
	State v1alpha1.ContractState
	// VMName names the guest (the node's name).
	VMName string
	// Node carries ownerDid, adopt, nodeJoin and nodeClaimRef; its Contract is set to Name.
	Node v1alpha1.InfraContractNode
	// Bundle is the Secret with the join bundle, the ComputeContract's secretsRef; nil
	// until it is written.
	Bundle *v1alpha1.SecretKeyRef
	// PolicyArgs are the contract's policyArgs (the node contracts' bid window).
	PolicyArgs map[string]string
	// RequireLayers are the layers the winner's offering must state (pod-user-namespaces
	// for a cluster that runs every pod in a user namespace). An entry keeps the ones it
	// was first declared with: its contract's market flow may already be under way.
	RequireLayers []string
	// RequireIsolation is the weakest boundary the winner's offering must state (the
	// Cluster's nodeIsolation); kept, as RequireLayers are.
	RequireIsolation v1alpha1.IsolationBoundary
	// RequireArch is the architecture the winner's offering must state (the Cluster's
	// nodeArch); kept, as RequireLayers are.
	RequireArch string
	// CPUs and MemMiB are the node's size, what its contract asks the market for (0: the
	// contract's default). An entry keeps the size it was first declared with.
	CPUs, MemMiB int32
}

// NodeEntryState is the desired state of a claim's entry: Released once the claim is
// deleting or ended (Failed, Lost, Released); Staged until its join bundle is written;
// Requested after.
func NodeEntryState(deleting bool, phase v1alpha1.NodeClaimPhase, bundleWritten bool) v1alpha1.ContractState {
	switch {
	case deleting || NodeClaimEnded(phase):
		return v1alpha1.ContractReleased
	case !bundleWritten:
		return v1alpha1.ContractStaged
	}
	return v1alpha1.ContractRequested
}

// NodeClaimEnded reports whether a claim phase is terminal.
func NodeClaimEnded(p v1alpha1.NodeClaimPhase) bool {
	return p == v1alpha1.NodeClaimFailed || p == v1alpha1.NodeClaimLost || p == v1alpha1.NodeClaimReleased
}

// ClusterInfra is the identity of a cluster's Infra, the part of its spec and labels that
// does not depend on any one entry.
type ClusterInfra struct {
	// Cluster names the Cluster (namespace = its home workspace).
	Cluster v1alpha1.ObjectRef
}

// Description is the Infra's description: it names the cluster, not its workspace (a
// description is published when the Infra is bound to a record).
func (c ClusterInfra) Description() string {
	return fmt.Sprintf("nodes of tenant cluster %s", c.Cluster.Name)
}

// ComposeNodeEntry returns spec with exactly one entry changed: want replaces (or adds, at
// the end) the entry want.Name; a nil want drops entry. Every other contract, secret and
// node is kept as it is and in its order, so two claims of one cluster, each composing its
// own entry on the spec it just read, never lose each other's. The cluster's clusterRef and
// description are set; the record binding is left as it is.
func ComposeNodeEntry(spec v1alpha1.InfraSpec, c ClusterInfra, entry string, want *NodeEntry) v1alpha1.InfraSpec {
	out := *spec.DeepCopy()
	ref := c.Cluster
	out.ClusterRef = &ref
	out.Description = c.Description()

	out.Contracts = out.Contracts[:0:0]
	replaced := false
	for _, k := range spec.Contracts {
		if k.Name != entry {
			out.Contracts = append(out.Contracts, *k.DeepCopy())
			continue
		}
		if want != nil {
			out.Contracts = append(out.Contracts, nodeContract(k, want))
			replaced = true
		}
	}
	if want != nil && !replaced {
		out.Contracts = append(out.Contracts, nodeContract(v1alpha1.InfraContract{}, want))
	}

	out.Secrets = out.Secrets[:0:0]
	for _, s := range spec.Secrets {
		if s.Contract != entry {
			out.Secrets = append(out.Secrets, s)
		}
	}
	if want != nil && want.Bundle != nil {
		out.Secrets = append(out.Secrets, v1alpha1.InfraContractSecret{Contract: entry, SecretRef: *want.Bundle})
	}

	out.Nodes = out.Nodes[:0:0]
	for _, n := range spec.Nodes {
		if n.Contract != entry {
			out.Nodes = append(out.Nodes, *n.DeepCopy())
		}
	}
	if want != nil {
		n := *want.Node.DeepCopy()
		n.Contract = entry
		out.Nodes = append(out.Nodes, n)
	}
	if len(out.Contracts) == 0 {
		out.Contracts = nil
	}
	if len(out.Secrets) == 0 {
		out.Secrets = nil
	}
	if len(out.Nodes) == 0 {
		out.Nodes = nil
	}
	return out
}

// nodeContract is the entry's contract: computeKind node, its name, state, vmName and
// requirements. A Released entry keeps the releaseRequestedAt it had; an entry declared
// before keeps its required layers, isolation and architecture (its market flow may be
// under way).
func nodeContract(prev v1alpha1.InfraContract, want *NodeEntry) v1alpha1.InfraContract {
	layers, isolation, arch := slices.Clone(want.RequireLayers), want.RequireIsolation, want.RequireArch
	cpus, mem := want.CPUs, want.MemMiB
	if prev.Name != "" {
		layers, isolation, arch = slices.Clone(prev.RequireLayers), prev.RequireIsolation, prev.RequireArch
		cpus, mem = prev.CPUs, prev.MemMiB
	}
	return v1alpha1.InfraContract{
		Name:               want.Name,
		State:              want.State,
		VMName:             want.VMName,
		ComputeKind:        v1alpha1.ComputeKindNode,
		PolicyArgs:         maps.Clone(want.PolicyArgs),
		RequireLayers:      layers,
		RequireIsolation:   isolation,
		RequireArch:        arch,
		CPUs:               cpus,
		MemMiB:             mem,
		ReleaseRequestedAt: prev.ReleaseRequestedAt.DeepCopy(),
	}
}

// NodeEntryOf finds entry in spec: its contract, its node fields and its secret.
func NodeEntryOf(spec v1alpha1.InfraSpec, entry string) (*NodeEntry, bool) {
	var e NodeEntry
	found := false
	for _, c := range spec.Contracts {
		if c.Name == entry {
			e.Name, e.State, e.VMName, found = c.Name, c.State, c.VMName, true
			e.PolicyArgs = maps.Clone(c.PolicyArgs)
			e.RequireLayers = slices.Clone(c.RequireLayers)
			e.RequireIsolation = c.RequireIsolation
			e.RequireArch = c.RequireArch
			e.CPUs, e.MemMiB = c.CPUs, c.MemMiB
		}
	}
	if !found {
		return nil, false
	}
	for _, n := range spec.Nodes {
		if n.Contract == entry {
			e.Node = *n.DeepCopy()
		}
	}
	for _, s := range spec.Secrets {
		if s.Contract == entry {
			r := s.SecretRef
			e.Bundle = &r
		}
	}
	return &e, true
}

// NodeClaimObservation is what the NodeClaim controller has read about its entry.
type NodeClaimObservation struct {
	// Entry is the entry's desired state as the controller last composed it ("" when the
	// claim has no entry: it was dropped, or the Infra is gone).
	Entry v1alpha1.ContractState
	// Adopt is the claim's spec.adopt.
	Adopt bool
	// Contract is the entry's ComputeContract status; nil when there is none.
	Contract *v1alpha1.ComputeContractStatus
	// Observed is the entry's phase in the Infra's status.contracts ("" when not reported).
	Observed v1alpha1.InfraContractPhase
	// NodeReady is true when the tenant cluster reports the claim's node Ready.
	NodeReady bool
	// Previous is the claim's current status.phase.
	Previous v1alpha1.NodeClaimPhase
}

// NodeClaimPhaseOf maps the entry and its ComputeContract onto the claim's phase:
//
//	entry / ComputeContract                     phase
//	ended claim (Failed, Lost, Released)        unchanged: terminal phases stay
//	Staged, or no entry yet                     Pending
//	Requested, none or Pending/Requesting       Bidding (Adopting with spec.adopt)
//	Held, guest not reported                    Provisioning
//	Held, guest reported (address or ready)     Joining
//	Held, tenant node Ready                     Running
//	Failed                                      Failed
//	Requested, Released or Releasing            Lost (the guest went without a release)
//	Requested, none but the Infra saw it end    Lost
//	Released entry, Releasing or not finished   unchanged (the release is in flight)
//	Released entry, Released or gone            Released
func NodeClaimPhaseOf(o NodeClaimObservation) v1alpha1.NodeClaimPhase {
	if NodeClaimEnded(o.Previous) {
		return o.Previous
	}
	cc := o.Contract
	if cc != nil && cc.Phase == v1alpha1.ComputeContractFailed {
		return v1alpha1.NodeClaimFailed
	}
	switch o.Entry {
	case v1alpha1.ContractReleased:
		if cc == nil || cc.Phase == v1alpha1.ComputeContractReleased {
			return v1alpha1.NodeClaimReleased
		}
		return orPending(o.Previous)
	case v1alpha1.ContractRequested:
		if cc == nil {
			if o.Observed == v1alpha1.InfraContractReleased {
				return v1alpha1.NodeClaimLost
			}
			return bidding(o.Adopt)
		}
		switch cc.Phase {
		case v1alpha1.ComputeContractHeld:
			switch {
			case o.NodeReady:
				return v1alpha1.NodeClaimRunning
			case guestReported(cc):
				return v1alpha1.NodeClaimJoining
			}
			return v1alpha1.NodeClaimProvisioning
		case v1alpha1.ComputeContractReleasing, v1alpha1.ComputeContractReleased:
			return v1alpha1.NodeClaimLost
		}
		return bidding(o.Adopt)
	}
	return v1alpha1.NodeClaimPending
}

func orPending(p v1alpha1.NodeClaimPhase) v1alpha1.NodeClaimPhase {
	if p == "" {
		return v1alpha1.NodeClaimPending
	}
	return p
}

func bidding(adopt bool) v1alpha1.NodeClaimPhase {
	if adopt {
		return v1alpha1.NodeClaimAdopting
	}
	return v1alpha1.NodeClaimBidding
}

// guestReported: the winner said the guest is up (an address, or a ready event).
func guestReported(cc *v1alpha1.ComputeContractStatus) bool {
	if cc.Guest != nil && cc.Guest.Address != "" {
		return true
	}
	for _, e := range cc.Events {
		if e.Type == "ready" {
			return true
		}
	}
	return false
}

// StaleNodeEntries are the entries of spec whose claim is gone or was recreated: its
// nodeClaimRef names no claim in claims, or one whose uid does not give this entry's name.
// claims maps namespace/name to uid. An entry with no nodeClaimRef is stale too.
func StaleNodeEntries(spec v1alpha1.InfraSpec, claims map[string]string) []string {
	var out []string
	for _, c := range spec.Contracts {
		var ref *v1alpha1.ObjectRef
		for _, n := range spec.Nodes {
			if n.Contract == c.Name {
				ref = n.NodeClaimRef
			}
		}
		if ref == nil {
			out = append(out, c.Name)
			continue
		}
		uid, ok := claims[ref.Namespace+"/"+ref.Name]
		if !ok || NodeEntryName(uid) != c.Name {
			out = append(out, c.Name)
		}
	}
	return out
}

// OwnerRepoName is the AtprotoRepo, in the contract workspace, of the cluster owner did: the
// repo a cluster Infra publishes its record to when the Cluster opts in (publishInfra):
// owner-<16 hex of sha256(did)> (a DID is not a valid object name).
func OwnerRepoName(did string) string {
	sum := sha256.Sum256([]byte(did))
	return "owner-" + hex.EncodeToString(sum[:])[:16]
}

// ClusterRecordBinding is the record binding a cluster's Infra carries: none unless the
// Cluster opted in (spec.publishInfra) and is not being deleted; then the owner's repo
// (OwnerRepoName of spec.account, in the Infra's own workspace) with sync Publish: the record
// shows the nodes and an edit of it is overwritten, never pulled (an entry added or removed
// on the PDS must not scale the cluster).
func ClusterRecordBinding(c *v1alpha1.Cluster) *v1alpha1.InfraRecordBinding {
	if c == nil || !c.Spec.PublishInfra || !c.DeletionTimestamp.IsZero() || c.Spec.Account == "" {
		return nil
	}
	return &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: OwnerRepoName(c.Spec.Account)},
		Sync: v1alpha1.RecordSyncPublish}
}

// NodeGraces bound how long a claim waits on its node: Join from the contract's Held until
// the node first reports Ready, Loss from a joined node's last Ready report. Past either the
// claim is Lost, which releases its entry (NodeEntryState) and so the guest.
type NodeGraces struct {
	Join, Loss time.Duration
}

// DefaultNodeGraces: a node boots and joins in seconds here, so three minutes is generous for
// a slow market guest; two minutes of NotReady is past Kubernetes' own node-monitor grace
// (40 s) and a kubelet restart, and short enough that pending pods get a node again soon.
var DefaultNodeGraces = NodeGraces{Join: 3 * time.Minute, Loss: 2 * time.Minute}

// NodeOverdue says whether a claim whose contract is Held but whose node is not Ready has
// waited past its grace: the join grace when the node never joined (joined false), the loss
// grace once it had. notReadySince is when the claim last saw the node not Ready after Ready
// (or began waiting for it). When not overdue, wait is how long until it would be; a claim
// whose node is Ready is never overdue.
func NodeOverdue(nodeReady, joined bool, notReadySince, now time.Time, g NodeGraces) (lost bool, message string, wait time.Duration) {
	if nodeReady {
		return false, "", 0
	}
	grace, what := g.Join, "did not join the cluster"
	if joined {
		grace, what = g.Loss, "stopped reporting Ready"
	}
	if grace <= 0 {
		return false, "", 0
	}
	waited := now.Sub(notReadySince)
	if waited >= grace {
		return true, fmt.Sprintf("the node %s within %s; its guest is released", what, grace), 0
	}
	return false, "", grace - waited
}
