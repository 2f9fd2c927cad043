package v1alpha1

// Labels set on objects created by the controllers of this API.
const (
	// LabelInfraKind is the kind (Infra or EphemeralInfra) of the deployment that owns an object.
	LabelInfraKind = "infra.socialweb.computer/kind"
	// LabelInfraName is the name of the deployment that owns an object.
	LabelInfraName = "infra.socialweb.computer/name"
	// LabelInfraContract is the contract name, within its deployment, of a ComputeContract.
	LabelInfraContract = "infra.socialweb.computer/contract"
	// LabelInfraCollection is the name of the collection that created a deployment.
	LabelInfraCollection = "infra.socialweb.computer/collection"
	// LabelInfraCluster is the name of the Cluster an object belongs to.
	LabelInfraCluster = "infra.socialweb.computer/cluster"
)

// Finalizers held by the controllers of this API.
const (
	// FinalizerInfraRelease holds a deployment until its ComputeContracts are released and its record child is gone.
	FinalizerInfraRelease = "infra.socialweb.computer/release"
	// FinalizerAtprotoRecord holds an AtprotoRecord until its record is deleted (or retained, per deletionPolicy).
	FinalizerAtprotoRecord = "socialweb.computer/atprotorecord"
	// FinalizerNodeClaimRelease holds a NodeClaim until its ComputeContract is released.
	FinalizerNodeClaimRelease = "nodeclaim.socialweb.computer/release"
	// FinalizerClusterTeardown holds a Cluster until its nodes and control plane are gone.
	FinalizerClusterTeardown = "cluster.socialweb.computer/teardown"
	// FinalizerComputeContractRelease holds a ComputeContract until the guest it won is released.
	FinalizerComputeContractRelease = "computecontract.socialweb.computer/release"
)

// ConditionType is the type of a metav1.Condition in a status of this API.
type ConditionType string

// Condition types.
const (
	// ConditionSynced is True when a deployment and its record agree.
	ConditionSynced ConditionType = "Synced"
	// ConditionSyncConflict is True when both sides changed and the record won.
	ConditionSyncConflict ConditionType = "SyncConflict"
	// ConditionRecordValid is False when the bound record does not decode into a declaration.
	ConditionRecordValid ConditionType = "RecordValid"
	// ConditionReady is True when an object is usable (a logged-in repo, a following watch, a deployed Infra).
	ConditionReady ConditionType = "Ready"
	// ConditionInSync is True when an AtprotoRecord's record in the repo matches its spec.
	ConditionInSync ConditionType = "InSync"
	// ConditionSecretsDelivered is True once a ComputeContract's spec.secretsRef reached the
	// winning bidder point to point; a contract with secretsRef is not Held before.
	ConditionSecretsDelivered ConditionType = "SecretsDelivered"
	// ConditionScaling is True on a Cluster while the node host is adding or releasing nodes;
	// its reason is the scale decision's.
	ConditionScaling ConditionType = "Scaling"
	// ConditionNodeReady is a NodeClaim's view of its tenant node; its transition time starts
	// the join grace (reason Joining) or the loss grace (NotReady after Ready).
	ConditionNodeReady ConditionType = "NodeReady"
)

// ConditionReason is the reason of a metav1.Condition in a status of this API.
type ConditionReason string

// Condition reasons.
const (
	// ReasonRecordWon: both sides changed; the record's change was pulled and the kcp change lost.
	ReasonRecordWon ConditionReason = "RecordWon"

	// ReasonLoggedIn: the AtprotoRepo holds a session for its account.
	ReasonLoggedIn ConditionReason = "LoggedIn"
	// ReasonLoginFailed: the AtprotoRepo's credentials were refused.
	ReasonLoginFailed ConditionReason = "LoginFailed"
	// ReasonUnreachable: the AtprotoRepo's service could not be reached.
	ReasonUnreachable ConditionReason = "Unreachable"
	// ReasonLocalRepoUnavailable: the AtprotoRepo names an account on the embedded PDS
	// (spec.local) and the controllers run without one (socialweb controllers).
	ReasonLocalRepoUnavailable ConditionReason = "LocalRepoUnavailable"

	// ReasonWritten: the AtprotoRecord controller wrote the record.
	ReasonWritten ConditionReason = "Written"
	// ReasonInSync: the record already matched the spec; nothing was written.
	ReasonInSync ConditionReason = "InSync"
	// ReasonSwapMismatch: the repo does not hold spec.swapCid, so the record was not written.
	ReasonSwapMismatch ConditionReason = "SwapMismatch"
	// ReasonRepoUnavailable: the referenced AtprotoRepo is missing or not Ready.
	ReasonRepoUnavailable ConditionReason = "RepoUnavailable"
	// ReasonInvalidRecord: the record was rejected as invalid.
	ReasonInvalidRecord ConditionReason = "InvalidRecord"

	// ReasonNameConflict: a collection's child name is already taken by an object it does not own.
	ReasonNameConflict ConditionReason = "NameConflict"
)

// Taints set on tenant Nodes.
const (
	// TaintNodeUnregistered is on a NodeClaim's Node from its registration (effect
	// NoSchedule) until the node host has nominated to it the pending pods its plan placed
	// there: lifted once the node is Ready and they are, so the scheduler's first try on the
	// node places those pods, not the first in its queue. Karpenter's karpenter.sh/unregistered.
	TaintNodeUnregistered = "node.socialweb.computer/unregistered"
)
