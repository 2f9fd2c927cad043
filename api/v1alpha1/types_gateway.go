package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GatewayAccess admits accounts to the cluster gateway, live, besides the gateway's flags
// (--gateway-allow, --gateway-open): the gateway serves the union of its flags and of every
// GatewayAccess in its namespace (gateway), read at start and watched. Removing an account
// here refuses it at its next call; it can never take away an account the flags admit.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=socialweb,shortName=gwaccess
// +kubebuilder:printcolumn:name="Open",type=boolean,JSONPath=`.spec.open`
// +kubebuilder:printcolumn:name="Allow",type=string,JSONPath=`.spec.allow`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type GatewayAccess struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec GatewayAccessSpec `json:"spec"`
}

// GatewayAccessSpec is whom it admits.
type GatewayAccessSpec struct {
	// allow are the DIDs of accounts the gateway serves.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=10000
	// +kubebuilder:validation:items:MaxLength=2048
	// +kubebuilder:validation:items:Pattern=`^did:[a-z]+:[a-zA-Z0-9._:%-]*[a-zA-Z0-9._-]$`
	Allow []string `json:"allow,omitempty"`

	// open serves every account whose DID resolves (as --gateway-open).
	// +optional
	Open bool `json:"open,omitempty"`
}

// GatewayAccessList is a list of GatewayAccess.
//
// +kubebuilder:object:root=true
type GatewayAccessList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GatewayAccess `json:"items"`
}

func init() {
	register(&GatewayAccess{}, &GatewayAccessList{})
}
