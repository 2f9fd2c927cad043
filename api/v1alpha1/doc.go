// Package v1alpha1 holds the socialweb.computer/v1alpha1 API: deployments
// (Infra, EphemeralInfra and their collections), the market's ComputeContract,
// the atproto kinds (AtprotoRepo, AtprotoRecord, AtprotoRecordWatch), the
// tenant-cluster kinds (Cluster, NodeClaim). Credentials are core/v1 Secrets, which the
// embedded API server serves too: no kind of this group is named like a core kind.
//
// Every kind is namespaced; a namespace stands for a workspace.
//
// +groupName=socialweb.computer
// +kubebuilder:object:generate=true
package v1alpha1
