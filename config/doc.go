// Package config holds the Kubernetes manifests of socialweb: the generated CRDs (crd), the
// RBAC of the controllers (rbac, its ClusterRole generated from the reconcilers' markers),
// their Deployment (manager) and the kustomization that puts them together for
// `kubectl apply -k config/default`. It has no code; its tests build the kustomization and
// check the Deployment against the restricted Pod Security profile and the roles against
// the markers they come from.
package config
