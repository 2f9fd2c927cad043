package podnet

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"socialweb.computer/internal/clusternet"
)

// Nodes on different hosts. A node's overlay endpoint is its link address, which only its
// own host reaches. A bidder whose nodes must be peers of nodes on other hosts publishes,
// for each node, an endpoint of its host instead: the host's public address (as the other
// hosts reach it) and a UDP port of its own, which the host forwards (DNAT) to the node's
// overlay port. What a node sends to another host's endpoint leaves like any egress, through
// the node's chain and the host's masquerade; WireGuard's roaming copes with the source port
// the masquerade picks. Between nodes of one host the published endpoint works too: the
// packet turns on the host (DNAT from one node link to another) and is never rewritten by
// the masquerade (HostNATRules).

// ChainOverlayIn is the host's nat chain the PREROUTING chain jumps to: one jump per node
// with a published endpoint, to that node's own chain (OverlayChain), which forwards its
// port.
const ChainOverlayIn = "SWNODE-OVERLAY"

// PortRange is a range of UDP ports of the host, First through Last.
type PortRange struct{ First, Last uint16 }

// DefaultOverlayPorts are the host ports published endpoints take when the operator names
// none: one per node, so up to a thousand nodes a host.
var DefaultOverlayPorts = PortRange{First: 51821, Last: 52820}

// ParsePortRange reads FIRST-LAST (or one port).
func ParsePortRange(s string) (PortRange, error) {
	first, last, found := strings.Cut(strings.TrimSpace(s), "-")
	if !found {
		last = first
	}
	f, err1 := strconv.ParseUint(first, 10, 16)
	l, err2 := strconv.ParseUint(last, 10, 16)
	if err1 != nil || err2 != nil || f == 0 || l < f {
		return PortRange{}, fmt.Errorf("overlay port range %q: want FIRST-LAST, two ports from 1 to 65535, FIRST <= LAST", s)
	}
	return PortRange{First: uint16(f), Last: uint16(l)}, nil
}

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Contains says whether port is in the range.
func (r PortRange) Contains(port uint16) bool { return port >= r.First && port <= r.Last }

// OverlayChain is the name of the host's nat chain forwarding the published endpoint of the
// node whose host link is link.
func OverlayChain(link string) string {
	return "SWNO-" + strings.TrimPrefix(link, LinkPrefix)
}

// OverlayForwardRule is the one rule of a node's OverlayChain: UDP to the published endpoint
// goes to the node's overlay port.
func OverlayForwardRule(public netip.AddrPort, node netip.Addr) []string {
	return []string{"-d", public.Addr().String() + "/32", "-p", "udp", "--dport", strconv.Itoa(int(public.Port())),
		"-j", "DNAT", "--to-destination", netip.AddrPortFrom(node, clusternet.OverlayPort).String()}
}

// ChoosePort picks the published port of a node: want when it is in the range and no other
// node of the host has it, else the lowest free port of the range. used are the ports the
// host's other nodes have. ErrNoOverlayPort when the range is full.
func ChoosePort(r PortRange, want uint16, used map[uint16]bool) (uint16, error) {
	if want != 0 && r.Contains(want) && !used[want] {
		return want, nil
	}
	for p := int(r.First); p <= int(r.Last); p++ {
		if !used[uint16(p)] {
			return uint16(p), nil
		}
	}
	return 0, &NoOverlayPortError{Range: r}
}

// NoOverlayPortError: every port of the range is some node's published endpoint.
type NoOverlayPortError struct{ Range PortRange }

func (e *NoOverlayPortError) Error() string {
	return fmt.Sprintf("every overlay port of %s is taken by a node of this host; widen the range (--overlay-ports)", e.Range)
}

// publishedPorts reads the ports the nat table's node overlay chains forward, by chain, from
// `iptables -t nat -S` output.
func publishedPorts(listing string) map[string]uint16 {
	out := map[string]uint16{}
	for _, l := range strings.Split(listing, "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "-A" || !strings.HasPrefix(f[1], "SWNO-") {
			continue
		}
		for i := 2; i+1 < len(f); i++ {
			if f[i] == "--dport" {
				if p, err := strconv.ParseUint(f[i+1], 10, 16); err == nil {
					out[f[1]] = uint16(p)
				}
			}
		}
	}
	return out
}

// PublishOverlay forwards a port of the host's public address to the overlay port of the
// node whose host link is link and address is node, and returns the endpoint to publish on
// its Node. want is the port it had before (a restarted node keeps its endpoint; 0 for a new
// node). Idempotent; RemoveNode takes it away.
func (h Host) PublishOverlay(link string, node, public netip.Addr, ports PortRange, want uint16) (netip.AddrPort, error) {
	if !strings.HasPrefix(link, LinkPrefix) || len(link) <= len(LinkPrefix) {
		return netip.AddrPort{}, fmt.Errorf("node link %q: want a name starting with %s", link, LinkPrefix)
	}
	if !public.Is4() || !node.Is4() {
		return netip.AddrPort{}, fmt.Errorf("overlay endpoint %s for node %s: want IPv4 addresses", public, node)
	}
	unlock, err := lockHost()
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer unlock()
	listing, err := iptables(h.Netns, "-t", "nat", "-S")
	if err != nil {
		return netip.AddrPort{}, err
	}
	chain := OverlayChain(link)
	published := publishedPorts(listing)
	if have, ok := published[chain]; ok && want == 0 {
		want = have
	}
	used := map[uint16]bool{}
	for c, p := range published {
		if c != chain {
			used[p] = true
		}
	}
	port, err := ChoosePort(ports, want, used)
	if err != nil {
		return netip.AddrPort{}, err
	}
	endpoint := netip.AddrPortFrom(public, port)
	if err := ensureJumpsChain(h.Netns, "nat", ChainOverlayIn); err != nil {
		return netip.AddrPort{}, err
	}
	if err := ensureJump(h.Netns, "nat", "PREROUTING", []string{"-j", ChainOverlayIn}); err != nil {
		return netip.AddrPort{}, err
	}
	if err := ensureChain(h.Netns, "nat", chain, [][]string{OverlayForwardRule(endpoint, node)}); err != nil {
		return netip.AddrPort{}, err
	}
	if err := ensureJump(h.Netns, "nat", ChainOverlayIn, []string{"-j", chain}); err != nil {
		return netip.AddrPort{}, err
	}
	return endpoint, nil
}
