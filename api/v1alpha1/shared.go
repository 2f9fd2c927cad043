package v1alpha1

// ObjectRef names another object of this API by namespace and name.
type ObjectRef struct {
	// namespace of the referenced object; empty means the namespace (workspace) of the referring object.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// name of the referenced object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// SecretKeyRef names one key of a core/v1 Secret in the referring object's namespace.
type SecretKeyRef struct {
	// name of the Secret (core/v1) in the referring object's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key within the Secret's data; empty means the default key of the field that holds this reference.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// KeyOr returns the referenced key, or def when none is set.
func (r SecretKeyRef) KeyOr(def string) string {
	if r.Key == "" {
		return def
	}
	return r.Key
}

// ComputeKind is the kind of guest a contract asks for.
type ComputeKind string

const (
	// ComputeKindVM is a qemu microVM whose init script is userData.
	ComputeKindVM ComputeKind = "vm"
	// ComputeKindDeno is a deno sandbox that runs userData as its program.
	ComputeKindDeno ComputeKind = "deno"
	// ComputeKindNode is a tenant-cluster node that joins a Cluster's API server.
	ComputeKindNode ComputeKind = "node"
)

// NodeJoin tells a guest how to join a tenant cluster as a Kubernetes node.
type NodeJoin struct {
	// server is the URL of the tenant API server the node dials.
	// +required
	// +kubebuilder:validation:MinLength=1
	Server string `json:"server"`

	// nodeName is the name the node registers under.
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// labels are set on the Node when it registers.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// taints are set on the Node when it registers, each as key[=value]:Effect.
	// +optional
	// +listType=atomic
	Taints []string `json:"taints,omitempty"`

	// bundleSecretRef names the Secret with the join bundle (CA bundle and bootstrap credentials).
	// +optional
	BundleSecretRef *SecretKeyRef `json:"bundleSecretRef,omitempty"`
}

// IsolationBoundary is what stands between a guest and its bidder's host, as a bidder's
// offering states it; a contract may require one.
type IsolationBoundary string

const (
	// IsolationVM: a hardware-virtualized or emulated machine per guest, with its own kernel.
	IsolationVM IsolationBoundary = "vm"
	// IsolationNamespace: Linux namespaces and cgroups on the bidder's own kernel.
	IsolationNamespace IsolationBoundary = "namespace"
)
