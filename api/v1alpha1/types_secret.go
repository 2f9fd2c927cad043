package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Secret holds sensitive data. It is this group's own Secret kind because the
// embedded API server serves no core/v1; the API server encrypts its data at
// rest. On a cluster that also serves core/v1, name it secrets.socialweb.computer.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,categories=socialweb
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.type`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Secret struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// type is a free-form hint of the data's shape, e.g. "password" or "node-join".
	// +optional
	Type string `json:"type,omitempty"`

	// data maps keys to values, base64-encoded in JSON and YAML.
	// +optional
	Data map[string][]byte `json:"data,omitempty"`
}

// SecretList is a list of Secret.
//
// +kubebuilder:object:root=true
type SecretList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Secret `json:"items"`
}

func init() {
	register(&Secret{}, &SecretList{})
}
