package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ContractState is the desired state of a declared contract, written by its composer.
// +kubebuilder:validation:Enum=Staged;Requested;Released
type ContractState string

const (
	// ContractStaged declares the contract without a ComputeContract, so no RFP is sent.
	ContractStaged ContractState = "Staged"
	// ContractRequested makes the controller apply the ComputeContract and run the RFP flow.
	ContractRequested ContractState = "Requested"
	// ContractReleased makes the controller release the contract's guest.
	ContractReleased ContractState = "Released"
)

// InfraContractPhase is the observed phase of a declared contract.
// +kubebuilder:validation:Enum=Staged;Requesting;Deployed;Releasing;Released;Failed
type InfraContractPhase string

const (
	// InfraContractStaged: declared only; no ComputeContract exists.
	InfraContractStaged InfraContractPhase = "Staged"
	// InfraContractRequesting: the ComputeContract is Pending or Requesting.
	InfraContractRequesting InfraContractPhase = "Requesting"
	// InfraContractDeployed: the ComputeContract is Held; a winner runs the guest.
	InfraContractDeployed InfraContractPhase = "Deployed"
	// InfraContractReleasing: the guest is being released.
	InfraContractReleasing InfraContractPhase = "Releasing"
	// InfraContractReleased: the guest is gone (or its finished ComputeContract was removed).
	InfraContractReleased InfraContractPhase = "Released"
	// InfraContractFailed: the ComputeContract failed.
	InfraContractFailed InfraContractPhase = "Failed"
)

// InfraPhase is the observed phase of a whole deployment.
// +kubebuilder:validation:Enum=Pending;Staged;Deploying;Deployed;Releasing;Released;Degraded;Ending;Deleting;Ended
type InfraPhase string

const (
	// InfraPending: not yet reconciled.
	InfraPending InfraPhase = "Pending"
	// InfraStaged: every contract is staged.
	InfraStaged InfraPhase = "Staged"
	// InfraDeploying: some contract is requesting.
	InfraDeploying InfraPhase = "Deploying"
	// InfraDeployed: every requested contract is deployed.
	InfraDeployed InfraPhase = "Deployed"
	// InfraReleasing: contracts are being released.
	InfraReleasing InfraPhase = "Releasing"
	// InfraReleased: every contract is released.
	InfraReleased InfraPhase = "Released"
	// InfraDegraded: some contract failed.
	InfraDegraded InfraPhase = "Degraded"
	// InfraEnding: an EphemeralInfra reached its end and is releasing before it deletes itself.
	InfraEnding InfraPhase = "Ending"
	// InfraDeleting: the object is being deleted and releases its contracts first.
	InfraDeleting InfraPhase = "Deleting"
	// InfraEnded: an EphemeralInfra ended and every contract is finished.
	InfraEnded InfraPhase = "Ended"
)

// RecordSyncMode says which way a deployment syncs with its record.
// +kubebuilder:validation:Enum=Both;Publish
type RecordSyncMode string

const (
	// RecordSyncBoth pushes kcp changes to the record and pulls record changes into the spec.
	RecordSyncBoth RecordSyncMode = "Both"
	// RecordSyncPublish only pushes; record changes made elsewhere are overwritten.
	RecordSyncPublish RecordSyncMode = "Publish"
)

// RecordSyncDirection is what the last sync of a deployment with its record did.
// +kubebuilder:validation:Enum=Created;Pushed;Pulled;InSync;Retained
type RecordSyncDirection string

const (
	// RecordCreated: the record was absent and kcp created it.
	RecordCreated RecordSyncDirection = "Created"
	// RecordPushed: a kcp change was written to the record.
	RecordPushed RecordSyncDirection = "Pushed"
	// RecordPulled: a record change was applied to the spec.
	RecordPulled RecordSyncDirection = "Pulled"
	// RecordInSync: both sides already agreed.
	RecordInSync RecordSyncDirection = "InSync"
	// RecordRetained: the binding was removed and the record left in the repo.
	RecordRetained RecordSyncDirection = "Retained"
)

// InfraSpec is the declaration of a deployment plus its optional record binding.
type InfraSpec struct {
	// description is a human-readable summary of the deployment; published to the record, whose
	// lexicon allows 300 graphemes and 3000 bytes: at most 300 characters keep within both.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	Description string `json:"description,omitempty"`

	// contracts are the deployment's declared compute contracts, replaced whole on apply; names must be unique.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(c, self.exists_one(d, d.name == c.name))",message="contract names must be unique"
	Contracts []InfraContract `json:"contracts,omitempty"`

	// secrets give a contract a Secret that becomes its ComputeContract's secretsRef; never published to the record.
	// +optional
	// +listType=map
	// +listMapKey=contract
	// +kubebuilder:validation:MaxItems=64
	Secrets []InfraContractSecret `json:"secrets,omitempty"`

	// record binds the deployment to one atproto record that carries its declaration and status.
	// +optional
	Record *InfraRecordBinding `json:"record,omitempty"`

	// clusterRef names the Cluster whose nodes this deployment provides; never published.
	// +optional
	ClusterRef *ObjectRef `json:"clusterRef,omitempty"`

	// nodes make a contract's guest a node of clusterRef's cluster; never published.
	// +optional
	// +listType=map
	// +listMapKey=contract
	// +kubebuilder:validation:MaxItems=64
	Nodes []InfraContractNode `json:"nodes,omitempty"`
}

// InfraContract is one declared contract: its desired state and the publishable ComputeContract fields.
type InfraContract struct {
	// name identifies the contract within the deployment (a DNS-1123 label).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// state is the desired state: Staged (declared, no RFP), Requested (run the RFP flow) or Released.
	// +optional
	// +kubebuilder:default=Staged
	State ContractState `json:"state,omitempty"`

	// releaseRequestedAt, with state Released, asks for a release; a newer time retries a failed release.
	// +optional
	ReleaseRequestedAt *metav1.Time `json:"releaseRequestedAt,omitempty"`

	// vmName is the name given to the guest.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="bytes(self).size() <= 253",message="must be at most 253 bytes of UTF-8 (the record's limit)"
	VMName string `json:"vmName,omitempty"`

	// computeKind is the kind of guest: vm (a qemu microVM), deno (a deno sandbox running userData) or node (a tenant-cluster node, declared with a spec.nodes entry by the NodeClaim controller).
	// +optional
	// +kubebuilder:default=vm
	// +kubebuilder:validation:Enum=vm;deno;node
	ComputeKind ComputeKind `json:"computeKind,omitempty"`

	// userData is cloud-init user_data for a vm, or the program for deno; public, never a secret.
	// At most 65536 bytes of UTF-8, the records' limit.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	// +kubebuilder:validation:XValidation:rule="bytes(self).size() <= 65536",message="must be at most 65536 bytes of UTF-8 (the limit of the record it is published in)"
	UserData string `json:"userData,omitempty"`

	// bidderDids, when set, are the only bidders (DIDs) whose bids are considered.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	BidderDids []string `json:"bidderDids,omitempty"`

	// denyBidderDids are bidders (DIDs) whose bids are refused.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	DenyBidderDids []string `json:"denyBidderDids,omitempty"`

	// sshAuthorizedKeys are public keys installed for the guest's login user.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=8192
	// +kubebuilder:validation:XValidation:rule="self.all(k, bytes(k).size() <= 8192)",message="each key must be at most 8192 bytes of UTF-8 (the record's limit)"
	SSHAuthorizedKeys []string `json:"sshAuthorizedKeys,omitempty"`

	// policy is the name of the policy workflow that picks a bid.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="bytes(self).size() <= 256",message="must be at most 256 bytes of UTF-8 (the record's limit)"
	Policy string `json:"policy,omitempty"`

	// requireIsolation is the weakest isolation boundary the winner's offering must state for this computeKind:
	// namespace (Linux namespaces and cgroups on the bidder's kernel) or vm (a machine per guest, stronger).
	// Bidders whose offering states less, or nothing, are not waited for and their bids are refused.
	// +optional
	// +kubebuilder:validation:Enum=vm;namespace
	RequireIsolation IsolationBoundary `json:"requireIsolation,omitempty"`

	// requireLayers are isolation layers the winner's offering must state for this computeKind,
	// each by its short name (e.g. pod-user-namespaces: a node's pods run in user namespaces of
	// their own). Bidders whose offering lacks one are not waited for and their bids are refused.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9][a-z0-9-]*$`
	RequireLayers []string `json:"requireLayers,omitempty"`

	// requireArch is the CPU architecture the winner's offering must state, as
	// kubernetes.io/arch names it (amd64, arm64). Bidders whose offering states another, or
	// none, are not waited for and their bids are refused. Unset: any.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z][a-z0-9]{1,31}$`
	RequireArch string `json:"requireArch,omitempty"`

	// cpus is how many CPUs the guest gets, its size on the market (the payload's cpus); unset: 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	CPUs int32 `json:"cpus,omitempty"`

	// memMiB is the guest's memory in MiB, its size on the market (the payload's mem); unset: 256.
	// +optional
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=4194304
	MemMiB int32 `json:"memMiB,omitempty"`

	// policyArgs are the arguments passed to the policy workflow.
	// +optional
	PolicyArgs map[string]string `json:"policyArgs,omitempty"`

	// vmReadyTimeoutSec bounds how long the guest may take to become ready, in seconds.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	VMReadyTimeoutSec *int32 `json:"vmReadyTimeoutSec,omitempty"`

	// ports are guest ports the winner forwards from its host; the ComputeContract's status.guest.ports says where.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Ports []ContractPort `json:"ports,omitempty"`
}

// InfraContractSecret gives one declared contract a Secret; never published to a record.
type InfraContractSecret struct {
	// contract is the name of the declared contract this Secret is for.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Contract string `json:"contract"`

	// secretRef names the Secret that becomes the ComputeContract's spec.secretsRef.
	// +required
	SecretRef SecretKeyRef `json:"secretRef"`
}

// InfraRecordBinding binds a deployment to an atproto record.
type InfraRecordBinding struct {
	// repoRef names the AtprotoRepo that holds (or will hold) the record.
	// +required
	RepoRef ObjectRef `json:"repoRef"`

	// uri is the at-uri of an existing record to follow; empty publishes this object at <repo DID>/<collection>/<name>.
	// +optional
	URI string `json:"uri,omitempty"`

	// eventSourceRefs name the event sources whose firehose triggers a re-read of the record.
	// +optional
	// +listType=atomic
	EventSourceRefs []ObjectRef `json:"eventSourceRefs,omitempty"`

	// sync is Both (push kcp changes, pull record changes) or Publish (push only).
	// +optional
	// +kubebuilder:default=Both
	Sync RecordSyncMode `json:"sync,omitempty"`
}

// InfraContractNode makes one declared contract's guest a node of the deployment's Cluster; never published.
type InfraContractNode struct {
	// contract is the name of the declared contract whose guest becomes the node.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Contract string `json:"contract"`

	// ownerDid is the DID of the cluster owner the node is provisioned for.
	// +optional
	OwnerDid string `json:"ownerDid,omitempty"`

	// adopt takes over a guest the owner already holds instead of bidding for a new one.
	// +optional
	Adopt bool `json:"adopt,omitempty"`

	// nodeJoin tells the guest how to join the tenant cluster.
	// +optional
	NodeJoin *NodeJoin `json:"nodeJoin,omitempty"`

	// nodeClaimRef names the NodeClaim this node serves.
	// +optional
	NodeClaimRef *ObjectRef `json:"nodeClaimRef,omitempty"`
}

// InfraStatus is the observed state of a deployment.
type InfraStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase summarises the deployment: Staged, Deploying, Deployed, Releasing, Released, Degraded, Ending, Deleting or Ended.
	// +optional
	Phase InfraPhase `json:"phase,omitempty"`

	// contracts report the observed phase of each declared contract.
	// +optional
	// +listType=atomic
	Contracts []InfraContractStatus `json:"contracts,omitempty"`

	// contractsReady counts deployed contracts over requested contracts, e.g. "1/3".
	// +optional
	ContractsReady string `json:"contractsReady,omitempty"`

	// contractsByPhase counts the declared contracts by observed phase, in lifecycle order,
	// e.g. "2 Deployed, 1 Staged"; "none" when none is declared.
	// +optional
	ContractsByPhase string `json:"contractsByPhase,omitempty"`

	// record is the state of the last sync with the bound record.
	// +optional
	Record *InfraRecordStatus `json:"record,omitempty"`

	// conditions are Synced, SyncConflict, RecordValid and Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// endedAt is when the deployment ended.
	// +optional
	EndedAt *metav1.Time `json:"endedAt,omitempty"`

	// endReason says why the deployment ended (Deadline or Complete).
	// +optional
	EndReason string `json:"endReason,omitempty"`
}

// InfraContractStatus is the observed state of one declared contract.
type InfraContractStatus struct {
	// name of the declared contract.
	// +required
	Name string `json:"name"`

	// phase of the contract: Staged, Requesting, Deployed, Releasing, Released or Failed.
	// +optional
	Phase InfraContractPhase `json:"phase,omitempty"`

	// computeContract is the name of the ComputeContract that runs this contract.
	// +optional
	ComputeContract string `json:"computeContract,omitempty"`

	// winner is the DID of the bidder that holds the guest.
	// +optional
	Winner string `json:"winner,omitempty"`

	// receipt is the at-uri of the winner's receipt record.
	// +optional
	Receipt string `json:"receipt,omitempty"`

	// message is a human-readable detail of the phase.
	// +optional
	Message string `json:"message,omitempty"`

	// releaseRequestedAt is the release request the controller last acted on.
	// +optional
	ReleaseRequestedAt *metav1.Time `json:"releaseRequestedAt,omitempty"`
}

// InfraRecordStatus is the state of the last sync between a deployment and its record.
type InfraRecordStatus struct {
	// uri is the at-uri of the bound record.
	// +optional
	URI string `json:"uri,omitempty"`

	// cid is the CID of the record as last read or written.
	// +optional
	CID string `json:"cid,omitempty"`

	// declarationHash is the sha256 of the canonical JSON of description and contracts at the last sync.
	// +optional
	DeclarationHash string `json:"declarationHash,omitempty"`

	// syncedGeneration is the metadata.generation of the last sync.
	// +optional
	SyncedGeneration int64 `json:"syncedGeneration,omitempty"`

	// syncedAt is when the last sync happened.
	// +optional
	SyncedAt *metav1.Time `json:"syncedAt,omitempty"`

	// direction is what the last sync did: Created, Pushed, Pulled, InSync or Retained.
	// +optional
	Direction RecordSyncDirection `json:"direction,omitempty"`
}

// Infra is a deployment: a set of compute contracts declared together, optionally synced with an atproto record.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=inf,categories=socialweb
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.contractsReady`,description="deployed contracts over requested ones"
// +kubebuilder:printcolumn:name="Contracts",type=string,JSONPath=`.status.contractsByPhase`,description="declared contracts by phase"
// +kubebuilder:printcolumn:name="Winner",type=string,JSONPath=`.status.contracts[*].winner`,description="the bidders whose guests run the contracts"
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Infra struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the deployment's declaration and record binding.
	// +optional
	Spec InfraSpec `json:"spec,omitempty"`

	// status is the observed state of the deployment.
	// +optional
	Status InfraStatus `json:"status,omitempty"`
}

// InfraList is a list of Infra.
//
// +kubebuilder:object:root=true
type InfraList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Infra `json:"items"`
}

// EndWhen says what ends an EphemeralInfra besides its deadline.
// +kubebuilder:validation:Enum=Complete;Deadline
type EndWhen string

const (
	// EndWhenComplete ends at the deadline or once every requested contract is Released or Failed.
	EndWhenComplete EndWhen = "Complete"
	// EndWhenDeadline ends only at the deadline.
	EndWhenDeadline EndWhen = "Deadline"
)

// EphemeralInfraSpec is an InfraSpec with a lifetime.
type EphemeralInfraSpec struct {
	InfraSpec `json:",inline"`

	// ttlSeconds is the lifetime in seconds from creation; the deployment ends at creationTimestamp + ttlSeconds.
	// +optional
	// +kubebuilder:default=3600
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=31536000
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// endWhen is Complete (end at the deadline or when every requested contract finished) or Deadline (only at the deadline).
	// +optional
	// +kubebuilder:default=Complete
	EndWhen EndWhen `json:"endWhen,omitempty"`
}

// EphemeralInfraStatus is an InfraStatus with the deadline.
type EphemeralInfraStatus struct {
	InfraStatus `json:",inline"`

	// expiresAt is the deadline: creationTimestamp + spec.ttlSeconds.
	// +optional
	ExpiresAt *metav1.Time `json:"expiresAt,omitempty"`
}

// EphemeralInfra is a deployment that ends by a deadline or on completion, then releases and deletes itself.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=einf,categories=socialweb
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.contractsReady`,description="deployed contracts over requested ones"
// +kubebuilder:printcolumn:name="Contracts",type=string,JSONPath=`.status.contractsByPhase`,description="declared contracts by phase"
// +kubebuilder:printcolumn:name="Winner",type=string,JSONPath=`.status.contracts[*].winner`,description="the bidders whose guests run the contracts"
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Expires",type=date,JSONPath=`.status.expiresAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EphemeralInfra struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the deployment's declaration, record binding and lifetime.
	// +optional
	Spec EphemeralInfraSpec `json:"spec,omitempty"`

	// status is the observed state of the deployment.
	// +optional
	Status EphemeralInfraStatus `json:"status,omitempty"`
}

// EphemeralInfraList is a list of EphemeralInfra.
//
// +kubebuilder:object:root=true
type EphemeralInfraList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EphemeralInfra `json:"items"`
}

func init() {
	register(&Infra{}, &InfraList{}, &EphemeralInfra{}, &EphemeralInfraList{})
}
