package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// InfraCollectionSpec names the repo whose deployment records a collection enumerates.
type InfraCollectionSpec struct {
	// repoRef names the AtprotoRepo whose records become child objects.
	// +required
	RepoRef ObjectRef `json:"repoRef"`

	// eventSourceRefs name the event sources whose firehose triggers a re-list of the records.
	// +optional
	// +listType=atomic
	EventSourceRefs []ObjectRef `json:"eventSourceRefs,omitempty"`
}

// InfraCollectionStatus is the observed state of a collection.
type InfraCollectionStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// children are the records found in the repo and the child object each one maps to.
	// +optional
	// +listType=atomic
	Children []CollectionChild `json:"children,omitempty"`

	// conditions report whether the collection is listing its repo (Ready).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CollectionChild is one record of the repo and the object it maps to.
type CollectionChild struct {
	// rkey is the record key in the repo.
	// +required
	RKey string `json:"rkey"`

	// uri is the at-uri of the record.
	// +optional
	URI string `json:"uri,omitempty"`

	// cid is the CID of the record as last listed.
	// +optional
	CID string `json:"cid,omitempty"`

	// name is the name of the child object bound to the record.
	// +optional
	Name string `json:"name,omitempty"`

	// boundBy is the name of another object, not owned by the collection, that already binds the record.
	// +optional
	BoundBy string `json:"boundBy,omitempty"`

	// conflict is the reason (NameConflict) the child could not be created, if any.
	// +optional
	Conflict string `json:"conflict,omitempty"`
}

// InfraCollection enumerates the computer.socialweb.infra records of a repo into child Infra objects.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=infc,categories=socialweb
// +kubebuilder:printcolumn:name="Repo",type=string,JSONPath=`.spec.repoRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type InfraCollection struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the repo to enumerate.
	// +required
	Spec InfraCollectionSpec `json:"spec"`

	// status lists the records found and their child objects.
	// +optional
	Status InfraCollectionStatus `json:"status,omitempty"`
}

// InfraCollectionList is a list of InfraCollection.
//
// +kubebuilder:object:root=true
type InfraCollectionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []InfraCollection `json:"items"`
}

// EphemeralInfraCollection enumerates the computer.socialweb.ephemeralInfra records of a repo into child EphemeralInfra objects.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Namespaced,shortName=einfc,categories=socialweb
// +kubebuilder:printcolumn:name="Repo",type=string,JSONPath=`.spec.repoRef.name`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EphemeralInfraCollection struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the repo to enumerate.
	// +required
	Spec InfraCollectionSpec `json:"spec"`

	// status lists the records found and their child objects.
	// +optional
	Status InfraCollectionStatus `json:"status,omitempty"`
}

// EphemeralInfraCollectionList is a list of EphemeralInfraCollection.
//
// +kubebuilder:object:root=true
type EphemeralInfraCollectionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EphemeralInfraCollection `json:"items"`
}

func init() {
	register(&InfraCollection{}, &InfraCollectionList{},
		&EphemeralInfraCollection{}, &EphemeralInfraCollectionList{})
}
