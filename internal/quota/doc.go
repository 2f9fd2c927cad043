// Package quota is what one account may hold of the tenant-cluster service: clusters, nodes
// and node-hours, and the decisions that enforce it. It is pure: callers count what the
// account holds (Usage), ask, and apply the answer. The gateway asks CheckClusters before it
// creates a Cluster; the node host asks Nodes before it creates NodeClaims.
//
// The one decision that shapes it: a limit is checked where a resource is about to be
// created, never by taking away what exists. An account over a limit (the operator lowered
// it, or node-hours ran out while its nodes ran) keeps its clusters and nodes; it gets no
// more until it is under the limit again.
package quota
