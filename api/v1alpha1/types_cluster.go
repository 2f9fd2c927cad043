package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ClusterPhase is the phase of a tenant cluster's control plane.
// +kubebuilder:validation:Enum=Unavailable;Initializing;Ready;Sleeping;Draining
type ClusterPhase string

const (
	// ClusterUnavailable: the control plane is not running.
	ClusterUnavailable ClusterPhase = "Unavailable"
	// ClusterInitializing: the control plane is starting.
	ClusterInitializing ClusterPhase = "Initializing"
	// ClusterReady: the control plane serves.
	ClusterReady ClusterPhase = "Ready"
	// ClusterSleeping: the control plane was stopped for want of use (spec.sleepAfter); its
	// store is kept and the first request through the gate or the gateway wakes it.
	ClusterSleeping ClusterPhase = "Sleeping"
	// ClusterDraining: the cluster is stopping and its nodes are being released.
	ClusterDraining ClusterPhase = "Draining"
)

// ClusterSpec is a tenant cluster's owner, name and desired size.
type ClusterSpec struct {
	// account is the DID of the cluster's owner; immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="account is immutable"
	Account string `json:"account"`

	// name is the cluster's name within the owner's account (a DNS-1123 label); immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="name is immutable"
	Name string `json:"name"`

	// running says whether the control plane should run; false stops it and releases the nodes.
	// +optional
	Running bool `json:"running,omitempty"`

	// maxNodes is the most nodes the cluster may scale out to.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	MaxNodes int32 `json:"maxNodes,omitempty"`

	// podsPerNode is how many pods one node is sized for, used to decide how many nodes are needed.
	// +optional
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=1
	PodsPerNode int32 `json:"podsPerNode,omitempty"`

	// scaleHold is how long demand must persist before nodes are added or removed, e.g. "2m".
	// +optional
	// +kubebuilder:default="2m"
	ScaleHold metav1.Duration `json:"scaleHold,omitempty"`

	// nodeSize bounds the size of each node the cluster rents, as a Karpenter NodePool's
	// requirements do. Every new node is sized to the pending pods it is bought for: the
	// smallest size within these bounds that the scheduling simulation packs them into; a pod
	// larger than the largest size is reported, never rented for. Unset bounds are 1..2 CPUs
	// and 256..4096 MiB.
	// +optional
	NodeSize *NodeSizeRange `json:"nodeSize,omitempty"`

	// nodeIsolation is the weakest isolation boundary the bidder of each new node must
	// state for node guests, as a NodePool's requirement: vm (a machine per node, the
	// flavour for workloads of strangers) or namespace (Linux namespaces and cgroups on the
	// bidder's kernel). Bidders stating less are not waited for and their bids are refused;
	// unset takes any. A node keeps the requirement it was rented under.
	// +optional
	// +kubebuilder:validation:Enum=vm;namespace
	NodeIsolation IsolationBoundary `json:"nodeIsolation,omitempty"`

	// nodeArch is the CPU architecture of each new node, as kubernetes.io/arch names it
	// (amd64, arm64), a NodePool's requirement: bidders whose offering does not state it
	// are not waited for and their bids are refused, and the scheduling simulation gives
	// the nodes it would buy that label, so a pod that selects another architecture is
	// reported, never rented for. Unset: any architecture, and the simulation takes a new
	// node to be of the architecture of the cluster's first node (before any, of the host
	// the node host runs on).
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9]{1,31}$`
	NodeArch string `json:"nodeArch,omitempty"`

	// nodeMaxPrice is the most a new node's winning bid may cost: bids over it, or priced in
	// another currency, are refused (a free bid always qualifies). It becomes each node
	// contract's policyArgs maxCost and currency. Unset: any price.
	// +optional
	NodeMaxPrice *NodePrice `json:"nodeMaxPrice,omitempty"`

	// consolidationPolicy says which nodes are released: WhenEmpty (the default) releases a
	// node empty past scaleHold; WhenUnderutilized also drains a node whose pods the
	// scheduling simulation places on the other nodes, once that has held for scaleHold,
	// as many nodes at a time as disruptionBudget allows, evicting their pods through the
	// Eviction API (PodDisruptionBudgets are honoured), and releases them. A node running a pod annotated
	// socialweb.computer/do-not-disrupt: "true", a Job's pod or a pod no controller owns
	// is never drained.
	// +optional
	// +kubebuilder:validation:Enum=WhenEmpty;WhenUnderutilized
	ConsolidationPolicy ConsolidationPolicy `json:"consolidationPolicy,omitempty"`

	// disruptionBudget is how many nodes a WhenUnderutilized cluster drains at once, as a
	// Karpenter NodePool's budget: a count ("2") or a percentage of the cluster's nodes,
	// rounded up ("10%": one node of up to ten). The nodes drained together are chosen so
	// that the pods of all of them fit on the rest; the next ones are drained once those
	// are released. "0" drains none (empty nodes are still released after scaleHold).
	// +optional
	// +kubebuilder:default="10%"
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:Pattern=`^((100|[0-9]{1,2})%|[0-9]+)$`
	DisruptionBudget string `json:"disruptionBudget,omitempty"`

	// sleepAfter, when set, stops the control plane once the cluster has had no node, no
	// node claim, no pod waiting for a node and no client connection for this long
	// (phase Sleeping; the store is kept and the control plane takes no memory). The first
	// request through the cluster's server URL (kubectl) or the gateway wakes it and is held,
	// not refused, until the control plane answers. While asleep nothing in the cluster
	// runs: a CronJob does not fire. Unset: never sleeps.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s')",message="sleepAfter must be at least 10s"
	SleepAfter *metav1.Duration `json:"sleepAfter,omitempty"`

	// publishInfra publishes the cluster's node deployments as records in the owner's repo.
	// +optional
	PublishInfra bool `json:"publishInfra,omitempty"`

	// members are the identities whose access to the cluster was decided beyond the owner's
	// implicit grant. An entry Revoked is a deny record: the gateway refuses that DID every
	// method that acts in the cluster (kubeconfig, apply, job reads), and the Cluster
	// controller keeps the DID's ServiceAccount and bindings out of the tenant cluster.
	// +optional
	// +listType=map
	// +listMapKey=did
	// +kubebuilder:validation:MaxItems=256
	Members []ClusterMember `json:"members,omitempty"`

	// podSecurity is the Pod Security Standards level the cluster enforces on every pod,
	// whatever its namespace's labels: baseline or restricted. The provider sets a floor
	// (baseline unless it chose restricted); a looser choice than the floor has no effect,
	// and status.podSecurity reports the level in force. Changing it restarts the control
	// plane.
	// +optional
	// +kubebuilder:validation:Enum=baseline;restricted
	PodSecurity string `json:"podSecurity,omitempty"`

	// podUserNamespaces says whether every pod runs in a user namespace of its own
	// (hostUsers: false), so that uid 0 in a pod is an unprivileged uid on its node's host:
	// required (a new pod that does not say gets hostUsers: false, one asking for
	// hostUsers: true is refused, and the cluster rents only nodes whose bidder states the
	// pod-user-namespaces layer) or optional (a pod chooses). The provider sets a floor; a
	// looser choice has no effect, and status.podUserNamespaces reports what is in force.
	// Changing it restarts the control plane; pods made before keep theirs.
	// +optional
	// +kubebuilder:validation:Enum=required;optional
	PodUserNamespaces string `json:"podUserNamespaces,omitempty"`
}

// ConsolidationPolicy says which nodes of a cluster are released.
type ConsolidationPolicy string

const (
	// ConsolidateWhenEmpty releases only nodes with no pod but daemon pods.
	ConsolidateWhenEmpty ConsolidationPolicy = "WhenEmpty"
	// ConsolidateWhenUnderutilized also drains and releases nodes whose pods fit elsewhere.
	ConsolidateWhenUnderutilized ConsolidationPolicy = "WhenUnderutilized"
)

// AnnotationDoNotDisrupt on a pod, "true", keeps its node from being drained for
// consolidation.
const AnnotationDoNotDisrupt = "socialweb.computer/do-not-disrupt"

// NodePrice is a price on the market: a whole number of the bids' unit in a currency.
type NodePrice struct {
	// cost is the amount, in the unit bids state.
	// +required
	// +kubebuilder:validation:Minimum=0
	Cost int64 `json:"cost"`
	// currency is what cost counts, as bids name it (e.g. USD).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]+$`
	Currency string `json:"currency"`
}

// NodeSizeRange bounds the CPUs and memory of a cluster's nodes; a zero bound takes its
// default.
// +kubebuilder:validation:XValidation:rule="!has(self.minCPUs) || !has(self.maxCPUs) || self.minCPUs <= self.maxCPUs",message="minCPUs must not exceed maxCPUs"
// +kubebuilder:validation:XValidation:rule="!has(self.minMemMiB) || !has(self.maxMemMiB) || self.minMemMiB <= self.maxMemMiB",message="minMemMiB must not exceed maxMemMiB"
type NodeSizeRange struct {
	// minCPUs is the fewest CPUs a node is rented with (default 1).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	MinCPUs int32 `json:"minCPUs,omitempty"`

	// maxCPUs is the most CPUs a node is rented with (default 2, or minCPUs when larger).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	MaxCPUs int32 `json:"maxCPUs,omitempty"`

	// minMemMiB is the least memory a node is rented with, in MiB (default 256).
	// +optional
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=4194304
	MinMemMiB int32 `json:"minMemMiB,omitempty"`

	// maxMemMiB is the most memory a node is rented with, in MiB (default 4096, or minMemMiB
	// when larger).
	// +optional
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=4194304
	MaxMemMiB int32 `json:"maxMemMiB,omitempty"`
}

// MemberState is an identity's access to a cluster.
// +kubebuilder:validation:Enum=Granted;Revoked
type MemberState string

const (
	// MemberGranted: the identity acts in the cluster through its ServiceAccount.
	MemberGranted MemberState = "Granted"
	// MemberRevoked: the identity is denied; the grant is kept to say so.
	MemberRevoked MemberState = "Revoked"
)

// ClusterMember is one identity's grant on a cluster.
type ClusterMember struct {
	// did is the identity.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	Did string `json:"did"`

	// state is Granted or Revoked.
	// +required
	State MemberState `json:"state"`

	// revokedAt is when the identity was revoked.
	// +optional
	RevokedAt *metav1.Time `json:"revokedAt,omitempty"`
}

// MemberStateOf is did's state on the cluster: its entry in spec.members, else Granted for
// the owner; ok is false for an identity that is no member.
func (s *ClusterSpec) MemberStateOf(did string) (state MemberState, ok bool) {
	for _, m := range s.Members {
		if m.Did == did {
			return m.State, true
		}
	}
	if did == s.Account {
		return MemberGranted, true
	}
	return "", false
}

// RevokedDids are the identities spec.members denies.
func (s *ClusterSpec) RevokedDids() []string {
	var out []string
	for _, m := range s.Members {
		if m.State == MemberRevoked {
			out = append(out, m.Did)
		}
	}
	return out
}

// ClusterStatus is the observed state of a tenant cluster.
type ClusterStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is Unavailable, Initializing, Ready or Draining.
	// +optional
	Phase ClusterPhase `json:"phase,omitempty"`

	// server is the URL of the tenant API server.
	// +optional
	Server string `json:"server,omitempty"`

	// instance identifies the running control-plane instance.
	// +optional
	Instance string `json:"instance,omitempty"`

	// nodes is the number of nodes joined to the cluster.
	// +optional
	Nodes int32 `json:"nodes,omitempty"`

	// podSecurity is the Pod Security level the control plane enforces on every pod.
	// +optional
	PodSecurity string `json:"podSecurity,omitempty"`

	// podUserNamespaces is required when the control plane runs every new pod in a user
	// namespace of its own, optional otherwise.
	// +optional
	PodUserNamespaces string `json:"podUserNamespaces,omitempty"`

	// teardownBlocked says what keeps a deleted cluster from going, if anything.
	// +optional
	TeardownBlocked string `json:"teardownBlocked,omitempty"`

	// conditions report details of the cluster's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Cluster is a tenant Kubernetes cluster whose nodes are guests bought on the compute market.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=socialweb
// +kubebuilder:printcolumn:name="Account",type=string,JSONPath=`.spec.account`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Running",type=boolean,JSONPath=`.spec.running`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.nodes`
// +kubebuilder:printcolumn:name="Server",type=string,JSONPath=`.status.server`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Cluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the cluster's owner, name and desired size.
	// +required
	Spec ClusterSpec `json:"spec"`

	// status is the observed state of the cluster.
	// +optional
	Status ClusterStatus `json:"status,omitempty"`
}

// ClusterList is a list of Cluster.
//
// +kubebuilder:object:root=true
type ClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Cluster `json:"items"`
}

// NodeClaimPhase is the phase of one tenant node.
// +kubebuilder:validation:Enum=Pending;Bidding;Provisioning;Joining;Running;Adopting;Failed;Lost;Released
type NodeClaimPhase string

const (
	// NodeClaimPending: not yet acted on.
	NodeClaimPending NodeClaimPhase = "Pending"
	// NodeClaimBidding: the node's contract is on the market.
	NodeClaimBidding NodeClaimPhase = "Bidding"
	// NodeClaimProvisioning: a winner is booting the guest.
	NodeClaimProvisioning NodeClaimPhase = "Provisioning"
	// NodeClaimJoining: the guest is up and joining the cluster.
	NodeClaimJoining NodeClaimPhase = "Joining"
	// NodeClaimRunning: the node is registered and ready.
	NodeClaimRunning NodeClaimPhase = "Running"
	// NodeClaimAdopting: an existing guest is being taken over.
	NodeClaimAdopting NodeClaimPhase = "Adopting"
	// NodeClaimFailed: the node could not be provisioned.
	NodeClaimFailed NodeClaimPhase = "Failed"
	// NodeClaimLost: the node stopped reporting.
	NodeClaimLost NodeClaimPhase = "Lost"
	// NodeClaimReleased: the node's guest was released.
	NodeClaimReleased NodeClaimPhase = "Released"
)

// NodeClaimSpec names the cluster and node a claim provides.
type NodeClaimSpec struct {
	// clusterRef names the Cluster the node joins.
	// +required
	ClusterRef ObjectRef `json:"clusterRef"`

	// nodeName is the name the node registers under in the tenant cluster.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName"`

	// ownerDid is the DID of the cluster owner the node is provisioned for.
	// +optional
	OwnerDid string `json:"ownerDid,omitempty"`

	// cpus is the size of the node to rent, in CPUs: what its contract asks the market for
	// and what the node advertises as allocatable. Unset: 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	CPUs int32 `json:"cpus,omitempty"`

	// memMiB is the node's memory in MiB, as cpus. Unset: 256.
	// +optional
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=4194304
	MemMiB int32 `json:"memMiB,omitempty"`

	// adopt takes over a guest the owner already holds instead of bidding for a new one.
	// +optional
	Adopt bool `json:"adopt,omitempty"`

	// maxPrice is the most this node's winning bid may cost. The node host sets it on a
	// node rented to replace others, below what they cost together, so that the
	// replacement is rented only when a bid makes it cheaper. It is the contract's cap in
	// place of the Cluster's nodeMaxPrice, unless that is lower in the same currency.
	// +optional
	MaxPrice *NodePrice `json:"maxPrice,omitempty"`

	// replaces are the nodes this node is rented to replace (a consolidation that moves
	// their pods onto one cheaper node): once it is Ready they are drained and released.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	Replaces []string `json:"replaces,omitempty"`
}

// NodeClaimStatus is the observed state of one tenant node.
type NodeClaimStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is Pending, Bidding, Provisioning, Joining, Running, Adopting, Failed, Lost or Released.
	// +optional
	Phase NodeClaimPhase `json:"phase,omitempty"`

	// infra locates the deployment and contract that provide the node's guest.
	// +optional
	Infra *NodeClaimInfra `json:"infra,omitempty"`

	// nodeName is the name the node registered under.
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// message is a human-readable detail of the phase.
	// +optional
	Message string `json:"message,omitempty"`

	// price is what the node costs: the winning bid's cost and currency, per hour (cost 0
	// and no currency for a free bid). Unset until a bid wins.
	// +optional
	Price *NodeClaimPrice `json:"price,omitempty"`

	// joinedAt is when the node joined the cluster.
	// +optional
	JoinedAt *metav1.Time `json:"joinedAt,omitempty"`

	// lastSeenAt is when the node was last seen ready.
	// +optional
	LastSeenAt *metav1.Time `json:"lastSeenAt,omitempty"`

	// conditions report details of the node's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeClaimPrice is what a rented node costs per hour, from its winning bid.
type NodeClaimPrice struct {
	// cost is the amount per hour, in the currency's smallest unit; 0 for a free bid.
	// +required
	// +kubebuilder:validation:Minimum=0
	Cost int64 `json:"cost"`
	// currency is what cost counts, as the bid names it; empty for a free bid.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Currency string `json:"currency,omitempty"`
}

// NodeClaimInfra locates the deployment and contract that provide a node's guest.
type NodeClaimInfra struct {
	// workspace is the namespace (workspace) of the deployment.
	// +optional
	Workspace string `json:"workspace,omitempty"`

	// name is the name of the Infra that provides the node.
	// +optional
	Name string `json:"name,omitempty"`

	// contract is the declared contract within that Infra.
	// +optional
	Contract string `json:"contract,omitempty"`

	// computeContract is the name of the ComputeContract that holds the guest.
	// +optional
	ComputeContract string `json:"computeContract,omitempty"`
}

// NodeClaim is one node of a tenant cluster, provided by a guest bought on the compute market.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,categories=socialweb
// +kubebuilder:printcolumn:name="Cluster",type=string,JSONPath=`.spec.clusterRef.name`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="CPUs",type=integer,JSONPath=`.spec.cpus`
// +kubebuilder:printcolumn:name="MemMiB",type=integer,JSONPath=`.spec.memMiB`
// +kubebuilder:printcolumn:name="Price",type=integer,JSONPath=`.status.price.cost`,priority=1
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the cluster and node.
	// +required
	Spec NodeClaimSpec `json:"spec"`

	// status is the observed state of the node.
	// +optional
	Status NodeClaimStatus `json:"status,omitempty"`
}

// NodeClaimList is a list of NodeClaim.
//
// +kubebuilder:object:root=true
type NodeClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeClaim `json:"items"`
}

func init() {
	register(&Cluster{}, &ClusterList{}, &NodeClaim{}, &NodeClaimList{})
}
