// Package clusternet holds the address plan every tenant cluster shares: its pod and service
// networks, the node-local DNS address, the overlay's port, and the range node substrates
// give their nodes on a host. Clusters are isolated from each other by where their traffic
// can go (each node's own network namespace, an overlay keyed per cluster, the host's
// forwarding rules), not by distinct ranges, so every cluster uses the same plan.
package clusternet

const (
	// ClusterCIDR is every tenant cluster's pod network; the controller-manager gives each
	// Node a /NodeCIDRMaskSize of it (spec.podCIDR).
	ClusterCIDR      = "10.42.0.0/16"
	NodeCIDRMaskSize = 24

	// ServiceCIDR is every tenant cluster's service network; its first address is the
	// kubernetes Service's ClusterIP.
	ServiceCIDR = "10.43.0.0/16"

	// ClusterDomain is the DNS domain of every tenant cluster.
	ClusterDomain = "cluster.local"

	// NodeLocalDNS is the address the DNS server of every node answers on, inside the
	// node (the kubelet's clusterDNS): a link-local address, as NodeLocal DNSCache uses,
	// so a pod's query never leaves its node.
	NodeLocalDNS = "169.254.20.10"

	// NodeNetwork is the range the node substrate gives its nodes' links on a host: a /30
	// each in 10.78.0.0/16 to namespace nodes, a /29 each in 10.79.0.0/16 to vm nodes. The
	// host routes it nowhere else, and no node's pod reaches another node's link through
	// the host.
	NodeNetwork = "10.78.0.0/15"

	// OverlayPort is the UDP port of every node's overlay (WireGuard) endpoint.
	OverlayPort = 51820
)
