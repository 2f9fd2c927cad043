package tunnel

import (
	"errors"
	"net/netip"
	"testing"
)

var testRanges = Ranges{Pods: netip.MustParsePrefix("10.42.0.0/16"), Services: netip.MustParsePrefix("10.43.0.0/16")}

func TestRoute(t *testing.T) {
	nodes := []Node{
		{Name: "b", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.42.1.0/24")}, Addresses: []netip.Addr{netip.MustParseAddr("10.78.0.6")}},
		{Name: "a", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.42.0.0/24")}, Addresses: []netip.Addr{netip.MustParseAddr("10.78.0.2")}},
		{Name: "down", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.42.2.0/24")}, Addresses: []netip.Addr{netip.MustParseAddr("10.78.0.10")}},
		// An owner-written Node claiming the host's loopback and a pod CIDR wider than the
		// cluster's network.
		{Name: "forged", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Addresses: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.0.2.2")}},
	}
	connected := func(n string) bool { return n != "down" }
	for _, tc := range []struct {
		target string
		want   string
		err    error
	}{
		{"10.42.1.7", "b", nil},
		{"10.42.0.9", "a", nil},
		{"10.78.0.6", "b", nil},                    // b's kubelet
		{"10.43.0.10", "a", nil},                   // a Service: the first connected node by name
		{"10.42.2.3", "", ErrNoNode},               // its node has no tunnel
		{"10.42.9.1", "", ErrNoNode},               // no node has that CIDR
		{"10.78.0.10", "", ErrOutsideCluster},      // a node address whose node is not connected
		{"10.78.0.99", "", ErrOutsideCluster},      // another cluster's node on the same host
		{"127.0.0.1", "forged", nil},               // see below
		{"169.254.169.254", "", ErrOutsideCluster}, // metadata services
		{"::ffff:10.42.1.7", "b", nil},
	} {
		got, err := Route(netip.MustParseAddr(tc.target), testRanges, nodes, connected)
		if tc.target == "127.0.0.1" {
			// A Node may name any address: it routes to that node's own tunnel, whose agent
			// refuses anything but its own kubelet (AllowInCluster). The host's loopback is
			// never dialled by the server.
			if err != nil || got != "forged" {
				t.Errorf("Route(%s) = %q, %v; want the forged node's own tunnel", tc.target, got, err)
			}
			continue
		}
		if got != tc.want || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
			t.Errorf("Route(%s) = %q, %v; want %q, %v", tc.target, got, err, tc.want, tc.err)
		}
	}
	if _, err := Route(netip.MustParseAddr("10.43.0.1"), testRanges, nil, connected); !errors.Is(err, ErrNoNode) {
		t.Errorf("a Service with no node: %v, want ErrNoNode", err)
	}
	// Two nodes rented on different hosts, each the first node of its host's link pool: the
	// address names neither, and the first of them would be the wrong one half the time.
	twins := append(nodes,
		Node{Name: "near", Addresses: []netip.Addr{netip.MustParseAddr("10.78.0.14")}},
		Node{Name: "far", Addresses: []netip.Addr{netip.MustParseAddr("10.78.0.14")}})
	if got, err := Route(netip.MustParseAddr("10.78.0.14"), testRanges, twins, connected); !errors.Is(err, ErrSharedAddress) {
		t.Errorf("an address two connected nodes have: %q, %v; want ErrSharedAddress", got, err)
	}
	// One of them not connected: the address is the other's.
	if got, err := Route(netip.MustParseAddr("10.78.0.14"), testRanges, twins, func(n string) bool { return n != "far" }); err != nil || got != "near" {
		t.Errorf("an address two nodes have, one connected: %q, %v; want near", got, err)
	}
}

func TestAllowInCluster(t *testing.T) {
	allow := AllowInCluster(testRanges, netip.MustParseAddr("10.78.0.6"), 10250)
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"10.42.1.7:8443", true},
		{"10.43.0.10:443", true},
		{"10.78.0.6:10250", true},
		{"10.78.0.6:22", false},    // the node's other ports
		{"10.78.0.2:10250", false}, // another node's kubelet
		{"10.78.0.5:10250", false}, // the host end of the node's link
		{"127.0.0.1:10250", false},
		{"10.77.0.1:443", false},
		{"203.0.113.80:80", false},
		{"10.42.1.7:0", false},
	} {
		if got := allow(netip.MustParseAddrPort(tc.addr)); got != tc.want {
			t.Errorf("allow(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}
