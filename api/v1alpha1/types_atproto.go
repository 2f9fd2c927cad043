package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DefaultCredentialsKey is the key of a RemoteRepoSource's credentialsRef when none is set.
const DefaultCredentialsKey = "password"

// AtprotoRepoSpec says where the repo lives: exactly one of local or remote.
// +kubebuilder:validation:XValidation:rule="has(self.local) != has(self.remote)",message="exactly one of local or remote must be set"
type AtprotoRepoSpec struct {
	// local is an account on the embedded PDS.
	// +optional
	Local *LocalRepoSource `json:"local,omitempty"`

	// remote is an account on another PDS, logged into with credentials.
	// +optional
	Remote *RemoteRepoSource `json:"remote,omitempty"`
}

// LocalRepoSource is an account on the embedded PDS.
type LocalRepoSource struct {
	// account is the handle or DID of the account on the embedded PDS.
	// +required
	// +kubebuilder:validation:MinLength=1
	Account string `json:"account"`
}

// RemoteRepoSource is an account on another PDS.
type RemoteRepoSource struct {
	// service is the URL of the PDS (or entryway) to log in to, e.g. https://bsky.social.
	// +required
	// +kubebuilder:validation:MinLength=1
	Service string `json:"service"`

	// identifier is the handle or DID to log in as.
	// +required
	// +kubebuilder:validation:MinLength=1
	Identifier string `json:"identifier"`

	// credentialsRef names the Secret holding the account's (app) password; key defaults to "password".
	// +required
	CredentialsRef SecretKeyRef `json:"credentialsRef"`
}

// AtprotoRepoStatus is the resolved identity of the repo and whether it is usable.
type AtprotoRepoStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// did is the account's DID.
	// +optional
	DID string `json:"did,omitempty"`

	// handle is the account's handle.
	// +optional
	Handle string `json:"handle,omitempty"`

	// endpoint is the URL of the PDS that hosts the repo.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// conditions: Ready (reasons LoggedIn, LoginFailed, Unreachable).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRepo is a handle on one atproto account's repo, local to the embedded PDS or remote with credentials.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=atprotorepos,scope=Namespaced,shortName=atrepo,categories=socialweb
// +kubebuilder:printcolumn:name="DID",type=string,JSONPath=`.status.did`
// +kubebuilder:printcolumn:name="Handle",type=string,JSONPath=`.status.handle`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRepo struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec says where the repo lives.
	// +required
	Spec AtprotoRepoSpec `json:"spec"`

	// status is the resolved identity and readiness of the repo.
	// +optional
	Status AtprotoRepoStatus `json:"status,omitempty"`
}

// AtprotoRepoList is a list of AtprotoRepo.
//
// +kubebuilder:object:root=true
type AtprotoRepoList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRepo `json:"items"`
}

// DeletionPolicy says what happens to a record when its AtprotoRecord is deleted.
// +kubebuilder:validation:Enum=Delete;Retain
type DeletionPolicy string

const (
	// DeletionPolicyDelete deletes the record from the repo.
	DeletionPolicyDelete DeletionPolicy = "Delete"
	// DeletionPolicyRetain leaves the record in the repo.
	DeletionPolicyRetain DeletionPolicy = "Retain"
)

// AtprotoRecordSpec is one record to keep written in a repo.
type AtprotoRecordSpec struct {
	// repoRef names the AtprotoRepo the record is written to.
	// +required
	RepoRef ObjectRef `json:"repoRef"`

	// collection is the record's collection NSID, e.g. computer.socialweb.infra.
	// +required
	// +kubebuilder:validation:MaxLength=317
	// +kubebuilder:validation:Pattern=`^[a-zA-Z]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)+(\.[a-zA-Z]([a-zA-Z0-9]{0,62})?)$`
	Collection string `json:"collection"`

	// rkey is the record key within the collection.
	// +required
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._:~-]{1,512}$`
	RKey string `json:"rkey"`

	// record is the record's JSON object, written as is (its $type should match collection).
	// +required
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	Record runtime.RawExtension `json:"record"`

	// swapCid, when set, makes the controller write only while the repo holds this CID for the record; empty writes over whatever the repo holds (unless createOnly).
	// +optional
	SwapCID string `json:"swapCid,omitempty"`

	// createOnly, with swapCid empty, makes the controller write the record only to create it: never over a record it finds at the path, and never again once it has seen one there (a record deleted after that stays deleted). Ignored when swapCid is set.
	// +optional
	CreateOnly bool `json:"createOnly,omitempty"`

	// deletionPolicy is Delete (delete the record with this object) or Retain (leave it in the repo).
	// +optional
	// +kubebuilder:default=Delete
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`
}

// AtprotoRecordStatus is the record as last written or verified.
type AtprotoRecordStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// uri is the at-uri of the record.
	// +optional
	URI string `json:"uri,omitempty"`

	// cid is the CID of the record as last written or verified.
	// +optional
	CID string `json:"cid,omitempty"`

	// lastWriteAt is when the controller last wrote the record.
	// +optional
	LastWriteAt *metav1.Time `json:"lastWriteAt,omitempty"`

	// conditions: InSync (reasons Written, InSync, SwapMismatch, RepoUnavailable, InvalidRecord).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// AtprotoRecord writes one record to a repo and repairs drift.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=atrec,categories=socialweb
// +kubebuilder:printcolumn:name="Collection",type=string,JSONPath=`.spec.collection`
// +kubebuilder:printcolumn:name="RKey",type=string,JSONPath=`.spec.rkey`
// +kubebuilder:printcolumn:name="InSync",type=string,JSONPath=`.status.conditions[?(@.type=="InSync")].status`
// +kubebuilder:printcolumn:name="CID",type=string,JSONPath=`.status.cid`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRecord struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the record to keep written.
	// +required
	Spec AtprotoRecordSpec `json:"spec"`

	// status is the record as last written or verified.
	// +optional
	Status AtprotoRecordStatus `json:"status,omitempty"`
}

// AtprotoRecordList is a list of AtprotoRecord.
//
// +kubebuilder:object:root=true
type AtprotoRecordList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRecord `json:"items"`
}

// AtprotoRecordWatchSpec is a collection of a repo to follow.
type AtprotoRecordWatchSpec struct {
	// repoRef names the AtprotoRepo whose collection is followed.
	// +required
	RepoRef ObjectRef `json:"repoRef"`

	// collection is the NSID of the collection to follow.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	Collection string `json:"collection"`

	// source says where the commits come from.
	// +optional
	Source WatchSource `json:"source,omitempty"`
}

// WatchSource says where a watch reads commits from.
type WatchSource struct {
	// eventSourceRefs name the event sources (firehoses) to follow.
	// +optional
	// +listType=atomic
	EventSourceRefs []ObjectRef `json:"eventSourceRefs,omitempty"`
}

// AtprotoRecordWatchStatus is what the watch has seen.
type AtprotoRecordWatchStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// cursor is the sequence number of the last event processed.
	// +optional
	Cursor int64 `json:"cursor,omitempty"`

	// records are the live records of the collection.
	// +optional
	// +listType=atomic
	Records []WatchedRecord `json:"records,omitempty"`

	// deleted are records of the collection seen deleted.
	// +optional
	// +listType=atomic
	Deleted []WatchedRecord `json:"deleted,omitempty"`

	// conditions: Ready when the watch is following its sources.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WatchedRecord is one record seen by a watch.
type WatchedRecord struct {
	// uri is the at-uri of the record.
	// +optional
	URI string `json:"uri,omitempty"`

	// cid is the CID of the record as last seen.
	// +optional
	CID string `json:"cid,omitempty"`
}

// AtprotoRecordWatch follows one collection of a repo through the firehose.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=atwatch,categories=socialweb
// +kubebuilder:printcolumn:name="Collection",type=string,JSONPath=`.spec.collection`
// +kubebuilder:printcolumn:name="Cursor",type=integer,JSONPath=`.status.cursor`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AtprotoRecordWatch struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the collection to follow.
	// +required
	Spec AtprotoRecordWatchSpec `json:"spec"`

	// status is what the watch has seen.
	// +optional
	Status AtprotoRecordWatchStatus `json:"status,omitempty"`
}

// AtprotoRecordWatchList is a list of AtprotoRecordWatch.
//
// +kubebuilder:object:root=true
type AtprotoRecordWatchList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AtprotoRecordWatch `json:"items"`
}

func init() {
	register(
		&AtprotoRepo{}, &AtprotoRepoList{},
		&AtprotoRecord{}, &AtprotoRecordList{},
		&AtprotoRecordWatch{}, &AtprotoRecordWatchList{},
	)
}
