package clusternet

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

// NodeInternalIP is the Node's first IPv4 InternalIP status address: its kubelet's --node-ip,
// its link on its own host (NodeNetwork), which nodes of one cluster on different hosts may
// share.
func NodeInternalIP(n *corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && ip.Is4() {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
