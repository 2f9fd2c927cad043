// Package v1alpha1 holds the socialweb.computer/v1alpha1 API: deployments
// (Infra, EphemeralInfra and their collections), the market's ComputeContract,
// the atproto kinds (AtprotoRepo, AtprotoRecord, AtprotoRecordWatch), the
// tenant-cluster kinds (Cluster, NodeClaim) and the group's own Secret kind.
//
// Every kind is namespaced; a namespace stands for a workspace.
//
// +groupName=socialweb.computer
// +kubebuilder:object:generate=true
package v1alpha1
