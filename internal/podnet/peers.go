// Package podnet is a tenant cluster's pod network across its nodes: the WireGuard overlay
// that joins the nodes' pod subnets (wireguard-go in userspace on a TUN device inside each
// node's network namespace), the decision of which peers a node has, and the egress rules
// that let a pod reach the internet but nothing of the host it runs on.
//
// Each node publishes its overlay public key and endpoint as annotations on its own Node; a
// node makes every other Node of its cluster a peer, with AllowedIPs taken from that Node's
// spec.podCIDRs (assigned by the controller-manager, never from an annotation). A node only
// accepts peers its own cluster's apiserver lists, so clusters sharing a host are kept apart
// by their keys. See docs/networking.md.
package podnet

import (
	"encoding/base64"
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"socialweb.computer/internal/clusternet"
)

// Annotations a node sets on its own Node (as flannel's WireGuard backend does).
const (
	AnnotationPublicKey = "podnet.socialweb.computer/public-key"
	AnnotationEndpoint  = "podnet.socialweb.computer/endpoint"
)

// Key is a Curve25519 key of the overlay (private or public).
type Key [32]byte

// String is the key in base64, as WireGuard writes keys.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

// ParseKey reads a base64 key.
func ParseKey(s string) (Key, error) {
	var k Key
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("not a base64 32-byte key")
	}
	copy(k[:], b)
	return k, nil
}

// Peer is another node of the same cluster as this node's overlay sees it.
type Peer struct {
	Node       string
	PublicKey  Key
	Endpoint   netip.AddrPort
	AllowedIPs []netip.Prefix
	// NodeAddress, when valid, is the Node's InternalIP, also in AllowedIPs (as a /32): a
	// pod reaches the other nodes' addresses (their NodePorts) through the overlay. Its
	// route lives in NodeRouteTable, not the main table (see Overlay).
	NodeAddress netip.Addr
}

// Skipped is a Node that is not a peer, and why.
type Skipped struct {
	Node, Reason string
}

// DesiredPeers decides the peers of node self from its cluster's Nodes: every other Node
// with a valid public key and endpoint annotation and at least one pod CIDR inside
// clusterCIDR. AllowedIPs are the Node's spec.podCIDRs (the controller-manager's, never an
// annotation's): an address range one node holds is never given to another, so a CIDR that
// overlaps self's own or one already given (in name order) makes that Node skipped. An
// endpoint must be a literal address and port: nothing here resolves a name. The result is
// sorted by node name.
//
// A peer's AllowedIPs also get its Node's InternalIP/32 (NodeAddress) when that address is
// inside nodeNetwork and is neither self's nor one already given: the peer stays a peer
// without it otherwise, and no address outside the nodes' range (the host's, the
// internet's) is ever carried into the overlay.
func DesiredPeers(self string, clusterCIDR, nodeNetwork netip.Prefix, nodes []corev1.Node) ([]Peer, []Skipped) {
	sorted := append([]corev1.Node(nil), nodes...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var taken []netip.Prefix
	for _, n := range sorted {
		if n.Name == self {
			ps, _ := podCIDRs(n, clusterCIDR)
			taken = append(taken, ps...)
			if a, ok := clusternet.NodeInternalIP(&n); ok {
				taken = append(taken, netip.PrefixFrom(a, 32))
			}
		}
	}
	var peers []Peer
	var skipped []Skipped
	keys := map[Key]string{}
	for _, n := range sorted {
		if n.Name == self {
			continue
		}
		skip := func(format string, args ...any) {
			skipped = append(skipped, Skipped{Node: n.Name, Reason: fmt.Sprintf(format, args...)})
		}
		if n.DeletionTimestamp != nil {
			skip("being deleted")
			continue
		}
		key, err := ParseKey(n.Annotations[AnnotationPublicKey])
		if err != nil {
			skip("annotation %s: %v", AnnotationPublicKey, err)
			continue
		}
		if other, dup := keys[key]; dup {
			skip("public key already that of node %s", other)
			continue
		}
		ep, err := netip.ParseAddrPort(n.Annotations[AnnotationEndpoint])
		if err != nil || !ep.Addr().Is4() || ep.Port() == 0 {
			skip("annotation %s %q: want IPv4:port", AnnotationEndpoint, n.Annotations[AnnotationEndpoint])
			continue
		}
		cidrs, err := podCIDRs(n, clusterCIDR)
		if err != nil {
			skip("%v", err)
			continue
		}
		if len(cidrs) == 0 {
			skip("no pod CIDR yet")
			continue
		}
		if p, q, ok := overlapping(cidrs, taken); ok {
			skip("pod CIDR %s overlaps %s, held by another node", p, q)
			continue
		}
		taken = append(taken, cidrs...)
		keys[key] = n.Name
		p := Peer{Node: n.Name, PublicKey: key, Endpoint: ep, AllowedIPs: cidrs}
		if a, ok := clusternet.NodeInternalIP(&n); ok && nodeNetwork.Contains(a) {
			addr := []netip.Prefix{netip.PrefixFrom(a, 32)}
			if _, _, clash := overlapping(addr, taken); !clash {
				taken = append(taken, addr...)
				p.AllowedIPs = append(append([]netip.Prefix(nil), cidrs...), addr...)
				p.NodeAddress = a
			}
		}
		peers = append(peers, p)
	}
	return peers, skipped
}

// podCIDRs are the Node's IPv4 pod CIDRs (spec.podCIDRs, else spec.podCIDR), each inside
// clusterCIDR.
func podCIDRs(n corev1.Node, clusterCIDR netip.Prefix) ([]netip.Prefix, error) {
	raw := n.Spec.PodCIDRs
	if len(raw) == 0 && n.Spec.PodCIDR != "" {
		raw = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("pod CIDR %q: %v", s, err)
		}
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		if !clusterCIDR.Contains(p.Addr()) || p.Bits() < clusterCIDR.Bits() {
			return nil, fmt.Errorf("pod CIDR %s is outside the cluster's %s", p, clusterCIDR)
		}
		out = append(out, p)
	}
	return out, nil
}

func overlapping(a, b []netip.Prefix) (netip.Prefix, netip.Prefix, bool) {
	for _, p := range a {
		for _, q := range b {
			if p.Overlaps(q) {
				return p, q, true
			}
		}
	}
	return netip.Prefix{}, netip.Prefix{}, false
}
