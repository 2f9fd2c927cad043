package podnet

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testKey(b byte) Key {
	var k Key
	k[0] = b
	return k
}

func node(name string, key Key, endpoint string, cidrs ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	if key != (Key{}) {
		n.Annotations[AnnotationPublicKey] = key.String()
	}
	if endpoint != "" {
		n.Annotations[AnnotationEndpoint] = endpoint
	}
	n.Spec.PodCIDRs = cidrs
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = cidrs[0]
	}
	return n
}

// withIP gives n the InternalIP addr.
func withIP(n corev1.Node, addr string) corev1.Node {
	n.Status.Addresses = append(n.Status.Addresses,
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: addr})
	return n
}

func TestDesiredPeers(t *testing.T) {
	cluster := netip.MustParsePrefix("10.42.0.0/16")
	nodeNetwork := netip.MustParsePrefix("10.78.0.0/16")
	self := node("a", testKey(1), "10.78.0.6:51820", "10.42.0.0/24")
	selfWithIP := withIP(self, "10.78.0.6")
	deleting := node("d", testKey(9), "10.78.0.30:51820", "10.42.9.0/24")
	deleting.DeletionTimestamp = &metav1.Time{}
	for _, tc := range []struct {
		name    string
		nodes   []corev1.Node
		peers   []string // node=endpoint=cidrs
		skipped []string // node: reason fragment
	}{
		{name: "alone", nodes: []corev1.Node{self}},
		{name: "two others, in name order", nodes: []corev1.Node{
			node("c", testKey(3), "10.78.0.14:51820", "10.42.2.0/24"), self,
			node("b", testKey(2), "10.78.0.10:51820", "10.42.1.0/24"),
		}, peers: []string{"b=10.78.0.10:51820=[10.42.1.0/24]", "c=10.78.0.14:51820=[10.42.2.0/24]"}},
		{name: "not yet annotated or assigned", nodes: []corev1.Node{self,
			node("b", Key{}, "10.78.0.10:51820", "10.42.1.0/24"),
			node("c", testKey(3), "", "10.42.2.0/24"),
			node("e", testKey(5), "10.78.0.18:51820"),
		}, skipped: []string{"b: public-key", "c: endpoint", "e: no pod CIDR"}},
		{name: "an endpoint is never a name to resolve", nodes: []corev1.Node{self,
			node("b", testKey(2), "node-b.example:51820", "10.42.1.0/24"),
			node("c", testKey(3), "10.78.0.14", "10.42.2.0/24"),
			node("e", testKey(5), "[fd00::1]:51820", "10.42.3.0/24"),
		}, skipped: []string{"b: endpoint", "c: endpoint", "e: endpoint"}},
		{name: "a pod CIDR outside the cluster's", nodes: []corev1.Node{self,
			node("b", testKey(2), "10.78.0.10:51820", "192.168.0.0/24"),
			node("c", testKey(3), "10.78.0.14:51820", "10.0.0.0/8"),
		}, skipped: []string{"b: outside", "c: outside"}},
		{name: "a pod CIDR overlapping self's or an earlier node's", nodes: []corev1.Node{self,
			node("b", testKey(2), "10.78.0.10:51820", "10.42.1.0/24"),
			node("c", testKey(3), "10.78.0.14:51820", "10.42.0.0/23"),
			node("e", testKey(5), "10.78.0.18:51820", "10.42.1.128/25"),
		}, peers: []string{"b=10.78.0.10:51820=[10.42.1.0/24]"}, skipped: []string{"c: overlaps", "e: overlaps"}},
		{name: "a public key another node already has", nodes: []corev1.Node{self,
			node("b", testKey(2), "10.78.0.10:51820", "10.42.1.0/24"),
			node("c", testKey(2), "10.78.0.14:51820", "10.42.2.0/24"),
		}, peers: []string{"b=10.78.0.10:51820=[10.42.1.0/24]"}, skipped: []string{"c: public key"}},
		{name: "a Node being deleted", nodes: []corev1.Node{self, deleting}, skipped: []string{"d: deleted"}},
		{name: "a peer's InternalIP in the node network is carried too", nodes: []corev1.Node{selfWithIP,
			withIP(node("b", testKey(2), "10.78.0.10:51820", "10.42.1.0/24"), "10.78.0.10"),
			node("c", testKey(3), "10.78.0.14:51820", "10.42.2.0/24"),
		}, peers: []string{"b=10.78.0.10:51820=[10.42.1.0/24 10.78.0.10/32]@10.78.0.10", "c=10.78.0.14:51820=[10.42.2.0/24]"}},
		{name: "an InternalIP outside the node network, self's, or another peer's is not carried", nodes: []corev1.Node{selfWithIP,
			withIP(node("b", testKey(2), "10.78.0.10:51820", "10.42.1.0/24"), "10.78.0.10"),
			withIP(node("c", testKey(3), "10.78.0.14:51820", "10.42.2.0/24"), "10.78.0.10"),
			withIP(node("e", testKey(5), "10.78.0.18:51820", "10.42.3.0/24"), "10.78.0.6"),
			withIP(node("f", testKey(6), "10.78.0.22:51820", "10.42.4.0/24"), "192.168.1.1"),
			withIP(node("g", testKey(7), "10.78.0.26:51820", "10.42.5.0/24"), "127.0.0.1"),
			withIP(node("h", testKey(8), "10.78.0.30:51820", "10.42.6.0/24"), "fd00::1"),
		}, peers: []string{"b=10.78.0.10:51820=[10.42.1.0/24 10.78.0.10/32]@10.78.0.10", "c=10.78.0.14:51820=[10.42.2.0/24]",
			"e=10.78.0.18:51820=[10.42.3.0/24]", "f=10.78.0.22:51820=[10.42.4.0/24]", "g=10.78.0.26:51820=[10.42.5.0/24]",
			"h=10.78.0.30:51820=[10.42.6.0/24]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peers, skipped := DesiredPeers("a", cluster, nodeNetwork, tc.nodes)
			var got []string
			for _, p := range peers {
				s := p.Node + "=" + p.Endpoint.String() + "=" + strings.Join(strs(p.AllowedIPs), ",")
				if p.NodeAddress.IsValid() {
					s += "@" + p.NodeAddress.String()
				}
				got = append(got, s)
			}
			if strings.Join(got, " ") != strings.Join(tc.peers, " ") {
				t.Errorf("peers %v, want %v", got, tc.peers)
			}
			if len(skipped) != len(tc.skipped) {
				t.Fatalf("skipped %+v, want %v", skipped, tc.skipped)
			}
			for i, s := range skipped {
				n, frag, _ := strings.Cut(tc.skipped[i], ": ")
				if s.Node != n || !strings.Contains(s.Reason, frag) {
					t.Errorf("skipped %+v, want %s", s, tc.skipped[i])
				}
			}
		})
	}
}

func strs(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return []string{"[" + strings.Join(out, " ") + "]"}
}
