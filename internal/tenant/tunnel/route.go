// Package tunnel carries what a tenant apiserver sends into its cluster (admission and
// conversion webhooks, aggregated APIs, the pod and Service proxy, the kubelet's API) over
// connections the cluster's own nodes open to it, as k3s's agent tunnel does.
//
// Every tenant cluster uses the same pod and Service ranges, and the apiserver runs on the
// provider's host, which routes none of them: a pod address means something only inside one
// cluster's nodes. So the apiserver never dials into the cluster itself. Its egress selector
// ("cluster") sends each such connection as an HTTP CONNECT to this package's Server, which
// picks the node that serves the address (Route) and asks that node's agent, over the
// tunnel the agent holds open (rancher/remotedialer, a websocket authenticated by the node's
// client certificate), to dial it from inside the node. An address outside the cluster (the
// host's loopback, its LAN, a name to resolve) has no node and is refused: whatever a
// cluster's owner writes into a webhook URL, a Node's addresses or a pod's status, the
// apiserver reaches nothing but that cluster's own nodes, and each node's agent in turn
// dials only its cluster's ranges and its own kubelet (AllowInCluster).
package tunnel

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// Ranges are a cluster's pod and Service networks (clusternet's plan).
type Ranges struct {
	Pods     netip.Prefix
	Services netip.Prefix
}

// Node is what routing needs of one Node of the cluster.
type Node struct {
	Name string
	// PodCIDRs are the Node's spec.podCIDRs, assigned by the controller-manager.
	PodCIDRs []netip.Prefix
	// Addresses are its status addresses (the kubelet's).
	Addresses []netip.Addr
}

var (
	// ErrOutsideCluster: the address is none of the cluster's pods, Services or nodes. It is
	// never dialled: the apiserver runs on a provider's host.
	ErrOutsideCluster = errors.New("address is outside the cluster (not a pod, Service or node address of it)")
	// ErrNoNode: the address is the cluster's, but no node that serves it has a tunnel open
	// (it is booting, gone, or its agent is reconnecting).
	ErrNoNode = errors.New("no connected node serves the address")
	// ErrSharedAddress: more than one connected node has the address. Nodes rented on
	// different hosts may (a node's address is its link on its own host, drawn from the same
	// range on every host); guessing would send one node's kubelet traffic to the other.
	ErrSharedAddress = errors.New("more than one node has the address (nodes on different hosts may share a link address)")
)

// Route names the node whose tunnel carries a connection to target: the node whose pod
// CIDR holds it, the node that has it as an address (its kubelet), or for a Service address
// any connected node (its kube-proxy forwards it), the first by name so that one apiserver's
// calls to a Service land on one node. connected says whether a node's tunnel is open.
func Route(target netip.Addr, r Ranges, nodes []Node, connected func(name string) bool) (string, error) {
	target = target.Unmap()
	switch {
	case r.Services.Contains(target):
		names := make([]string, 0, len(nodes))
		for _, n := range nodes {
			if connected(n.Name) {
				names = append(names, n.Name)
			}
		}
		if len(names) == 0 {
			return "", fmt.Errorf("service address %s: %w", target, ErrNoNode)
		}
		sort.Strings(names)
		return names[0], nil
	case r.Pods.Contains(target):
		for _, n := range nodes {
			for _, c := range n.PodCIDRs {
				// A pod CIDR outside the cluster's pod network (an owner may write Nodes)
				// serves nothing.
				if c.Overlaps(r.Pods) && c.Bits() >= r.Pods.Bits() && c.Contains(target) {
					if !connected(n.Name) {
						return "", fmt.Errorf("pod address %s (node %s): %w", target, n.Name, ErrNoNode)
					}
					return n.Name, nil
				}
			}
		}
		return "", fmt.Errorf("pod address %s is in no node's pod CIDR: %w", target, ErrNoNode)
	}
	var holders []string
	for _, n := range nodes {
		for _, a := range n.Addresses {
			if a.Unmap() == target && connected(n.Name) {
				holders = append(holders, n.Name)
				break
			}
		}
	}
	switch len(holders) {
	case 0:
		return "", fmt.Errorf("%s: %w", target, ErrOutsideCluster)
	case 1:
		return holders[0], nil
	}
	sort.Strings(holders)
	return "", fmt.Errorf("%s (nodes %s): %w", target, strings.Join(holders, ", "), ErrSharedAddress)
}

// AllowInCluster is what a node's agent dials for its apiserver: TCP to the cluster's pod and
// Service networks, and to its own address on the kubelet's port. Anything else (the
// provider's host, another node's kubelet, the internet) is refused on the node too, so a
// control plane that somehow asked for it still gets nothing.
func AllowInCluster(r Ranges, nodeIP netip.Addr, kubeletPort uint16) func(netip.AddrPort) bool {
	return func(ap netip.AddrPort) bool {
		a := ap.Addr().Unmap()
		if ap.Port() == 0 {
			return false
		}
		if r.Pods.Contains(a) || r.Services.Contains(a) {
			return true
		}
		return nodeIP.IsValid() && a == nodeIP.Unmap() && ap.Port() == kubeletPort
	}
}
