package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ComputeContractPhase is the phase of a contract on the market.
// +kubebuilder:validation:Enum=Pending;Requesting;Held;Releasing;Released;Failed
type ComputeContractPhase string

const (
	// ComputeContractPending: not yet picked up by the requester.
	ComputeContractPending ComputeContractPhase = "Pending"
	// ComputeContractRequesting: the RFP is out and bids are being weighed.
	ComputeContractRequesting ComputeContractPhase = "Requesting"
	// ComputeContractHeld: a winner holds the guest.
	ComputeContractHeld ComputeContractPhase = "Held"
	// ComputeContractReleasing: spec.release is set and the winner is releasing the guest.
	ComputeContractReleasing ComputeContractPhase = "Releasing"
	// ComputeContractReleased: the guest is gone.
	ComputeContractReleased ComputeContractPhase = "Released"
	// ComputeContractFailed: the contract could not be fulfilled.
	ComputeContractFailed ComputeContractPhase = "Failed"
)

// The size a contract asks the market for when its spec states none (cpus, memMiB).
const (
	DefaultContractCPUs   = 1
	DefaultContractMemMiB = 256
)

// ComputeContractSpec is what the requester asks the market for. Written only by the composer that owns it.
type ComputeContractSpec struct {
	// vmName is the name given to the guest.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="bytes(self).size() <= 253",message="must be at most 253 bytes of UTF-8 (the record's limit)"
	VMName string `json:"vmName,omitempty"`

	// computeKind is the kind of guest: vm (a qemu microVM), deno (a deno sandbox) or node (a tenant-cluster node).
	// +optional
	// +kubebuilder:default=vm
	// +kubebuilder:validation:Enum=vm;deno;node
	ComputeKind ComputeKind `json:"computeKind,omitempty"`

	// userData is cloud-init user_data for a vm, or the program for deno; at most 65536 bytes of
	// UTF-8, the limit of the compute.vm record it is published in.
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
	// +kubebuilder:default=300
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	VMReadyTimeoutSec *int32 `json:"vmReadyTimeoutSec,omitempty"`

	// ports are guest ports the winner forwards from its host; status.guest.ports says where.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Ports []ContractPort `json:"ports,omitempty"`

	// secretsRef names a Secret whose data is handed to the guest privately, never through a record:
	// once the winner's receipt binds, the requester sends it point to point to the winner's offering
	// endpoint (deliverSecrets, atproto service auth) and the guest boots with it. Every key of the
	// Secret is sent, or only key when set; keys must match [A-Za-z0-9][A-Za-z0-9_-]* (at most 63).
	// The contract is not Held before condition SecretsDelivered is True.
	// +optional
	SecretsRef *SecretKeyRef `json:"secretsRef,omitempty"`

	// repoRef names the requester's AtprotoRepo, which publishes the RFP and accept records.
	// +optional
	RepoRef *ObjectRef `json:"repoRef,omitempty"`

	// release, once set, asks the winner to release the guest.
	// +optional
	Release *ContractRelease `json:"release,omitempty"`

	// ownerDid is the DID the guest is provisioned for, when not the requester's own.
	// +optional
	OwnerDid string `json:"ownerDid,omitempty"`

	// adopt takes over a guest the owner already holds instead of bidding for a new one.
	// +optional
	Adopt bool `json:"adopt,omitempty"`

	// nodeJoin, for computeKind node, tells the guest how to join a tenant cluster.
	// +optional
	NodeJoin *NodeJoin `json:"nodeJoin,omitempty"`
}

// ContractRelease asks for a contract's guest to be released.
type ContractRelease struct {
	// requestedAt is when the release was asked for; a newer time retries a failed release.
	// +required
	RequestedAt metav1.Time `json:"requestedAt"`

	// reason says why the guest is released; published in the delete event, whose lexicon allows
	// 256 graphemes and 1024 bytes: at most 256 characters keep within both.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Reason string `json:"reason,omitempty"`
}

// ComputeContractStatus is the contract's progress through the market.
type ComputeContractStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase is Pending, Requesting, Held, Releasing, Released or Failed.
	// +optional
	Phase ComputeContractPhase `json:"phase,omitempty"`

	// rfp is the at-uri of the request-for-proposal record.
	// +optional
	RFP string `json:"rfp,omitempty"`

	// bids are the bids seen for the RFP.
	// +optional
	// +listType=atomic
	Bids []ContractBid `json:"bids,omitempty"`

	// winner is the DID of the bidder whose bid was accepted.
	// +optional
	Winner string `json:"winner,omitempty"`

	// accept is the at-uri of the requester's accept record.
	// +optional
	Accept string `json:"accept,omitempty"`

	// receipt is the at-uri of the winner's receipt record.
	// +optional
	Receipt string `json:"receipt,omitempty"`

	// events are the lifecycle records the winner published for the guest.
	// +optional
	// +listType=atomic
	Events []ContractEvent `json:"events,omitempty"`

	// guest is how to reach the running guest.
	// +optional
	Guest *GuestStatus `json:"guest,omitempty"`

	// message is a human-readable detail of the phase.
	// +optional
	Message string `json:"message,omitempty"`

	// releasedAt is when the guest was released.
	// +optional
	ReleasedAt *metav1.Time `json:"releasedAt,omitempty"`

	// conditions report details of the contract's progress.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ContractBid is one bid on a contract's RFP.
type ContractBid struct {
	// uri is the at-uri of the bid record.
	// +optional
	URI string `json:"uri,omitempty"`

	// bidder is the DID of the bidder.
	// +optional
	Bidder string `json:"bidder,omitempty"`

	// cost is the price asked, as a decimal string.
	// +optional
	Cost string `json:"cost,omitempty"`

	// currency is the unit of cost.
	// +optional
	Currency string `json:"currency,omitempty"`

	// refused, when set, says why the bid was refused.
	// +optional
	Refused string `json:"refused,omitempty"`
}

// ContractEvent is one lifecycle record the winner published for the guest.
type ContractEvent struct {
	// uri is the at-uri of the event record.
	// +optional
	URI string `json:"uri,omitempty"`

	// type is the kind of event (for example ready, poweroff, released).
	// +optional
	Type string `json:"type,omitempty"`

	// at is when the event happened.
	// +optional
	At *metav1.Time `json:"at,omitempty"`

	// message is a human-readable detail of the event.
	// +optional
	Message string `json:"message,omitempty"`
}

// GuestStatus is how to reach a running guest.
type GuestStatus struct {
	// address is the guest's reachable address.
	// +optional
	Address string `json:"address,omitempty"`

	// accelerator names the accelerator attached to the guest, if any.
	// +optional
	Accelerator string `json:"accelerator,omitempty"`

	// ports map guest ports to host ports.
	// +optional
	// +listType=atomic
	Ports []GuestPort `json:"ports,omitempty"`
}

// ContractPort is a port the guest listens on, asked to be reachable from outside it.
type ContractPort struct {
	// name identifies the port (a DNS-1123 label); a deno guest reads its host port from SOCIALWEB_PORT_<NAME>.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// port is the port inside the guest.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// GuestPort maps one guest port to a host port.
type GuestPort struct {
	// name of the port.
	// +optional
	Name string `json:"name,omitempty"`

	// guestPort is the port inside the guest.
	// +optional
	GuestPort int32 `json:"guestPort,omitempty"`

	// hostPort is the port on the bidder's host that forwards to guestPort.
	// +optional
	HostPort int32 `json:"hostPort,omitempty"`
}

// ComputeContract is one contract on the compute market: an RFP, its bids, the winner and the guest it holds.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=cc,categories=socialweb
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Kind",type=string,JSONPath=`.spec.computeKind`
// +kubebuilder:printcolumn:name="Winner",type=string,JSONPath=`.status.winner`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ComputeContract struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the requester asks for.
	// +optional
	Spec ComputeContractSpec `json:"spec,omitempty"`

	// status is the contract's progress through the market.
	// +optional
	Status ComputeContractStatus `json:"status,omitempty"`
}

// ComputeContractList is a list of ComputeContract.
//
// +kubebuilder:object:root=true
type ComputeContractList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ComputeContract `json:"items"`
}

func init() {
	register(&ComputeContract{}, &ComputeContractList{})
}
