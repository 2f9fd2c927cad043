// Package nodehost is the node host: for each Ready Cluster it watches the tenant cluster's
// pods and nodes (client-go informers against the tenant apiserver, as the control plane's
// admin), calls the pure scale decision (internal/scale) with them and the Cluster's
// NodeClaims, and applies it: Provision n creates n NodeClaims, Release cordons the nodes
// and deletes their claims. A Cluster that is not running, or is being deleted, releases
// every claim. It reports the decision on the Cluster (condition Scaling, status.nodes).
//
// The one decision that shapes it: the node host writes NodeClaims and nothing else of the
// nodes. What a claim becomes (its Infra entry, its contract, its guest) is the NodeClaim
// controller's; the node host only says how many nodes there should be and which go.
//
// Reconcile steps, a file each: watch (the tenant informers), input (the translation from
// tenant objects to scale.Input, pure), release (running false or deleted: every claim
// goes), apply (provision and release), status (once).
package nodehost
