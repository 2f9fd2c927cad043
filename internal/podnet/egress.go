package podnet

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/dirlock"
)

// Egress: a pod's traffic to anything outside the pod and service networks leaves its node
// masqueraded to the node's address (NodeMasqRules, in the node's namespace); on the host, a
// chain of ours filters what node links forward (ForwardRules, NodeChainRules): UDP to other
// nodes' overlay port, nothing of the host, nothing the operator denies, the rest out through
// the host's own masquerade (HostNATRules). Replies come back as established connections;
// nothing else new is forwarded into a node link.

// Chains of ours. The host's FORWARD jumps to ChainForward for every node link (the links
// are named LinkPrefix...); ChainEgress holds one jump per node link to that node's own chain
// (NodeChain), added and removed with the node, so several nodes and several state dirs on
// one host share the static chains and each owns its own.
const (
	ChainForward = "SWNODE-FORWARD"
	ChainEgress  = "SWNODE-EGRESS"
	ChainHostNAT = "SWNODE-POSTROUTING"
	ChainNodeNAT = "SWNODE-MASQ" // inside a node's network namespace
	LinkPrefix   = "swn"
)

// DefaultDeny are the destinations a pod may not reach unless the operator allows them: the
// private, shared, link-local, loopback, multicast, reserved and "this network" ranges.
var DefaultDeny = []string{
	"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16",
	"127.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4", "0.0.0.0/8",
}

// alwaysDenied are never reachable whatever the operator allows: the host's node links
// (other clusters' nodes; the overlay's UDP port is the one exception, allowed first), the
// pod and service networks (a packet for them that reached the host has no node to go to),
// loopback and link-local (cloud metadata services live at 169.254.169.254).
var alwaysDenied = []string{
	clusternet.NodeNetwork, clusternet.ClusterCIDR, clusternet.ServiceCIDR,
	"127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/8",
}

// EgressPolicy is what pods of a bidder's nodes may reach beyond their cluster.
type EgressPolicy struct {
	// Allow are destinations let through although Deny holds them (a registry or mirror on
	// the provider's private network). The always-denied ranges still win.
	Allow []netip.Prefix
	// Deny are destinations dropped: DefaultDeny and the operator's own.
	Deny []netip.Prefix
	// DNS are the bidder's DNS upstreams the node's DNS server forwards to: UDP and TCP to
	// each address and port pass before any range is dropped (a provider's resolver is
	// often on its private network, or link-local), nothing else to them.
	DNS []netip.AddrPort
}

// ParseEgressPolicy is DefaultDeny plus deny, with allow let through; each a CIDR (a bare
// address is its /32).
func ParseEgressPolicy(allow, deny []string) (EgressPolicy, error) {
	var p EgressPolicy
	var err error
	if p.Allow, err = parsePrefixes("allow", allow); err != nil {
		return p, err
	}
	if p.Deny, err = parsePrefixes("deny", append(append([]string(nil), DefaultDeny...), deny...)); err != nil {
		return p, err
	}
	return p, nil
}

// Strings is the policy as CIDR strings (for a node's state file).
func (p EgressPolicy) Strings() (allow, deny []string) {
	for _, a := range p.Allow {
		allow = append(allow, a.String())
	}
	for _, d := range p.Deny {
		deny = append(deny, d.String())
	}
	return allow, deny
}

func parsePrefixes(what string, ss []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, s := range ss {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(s, "/") {
			p, err = netip.ParsePrefix(s)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(s); err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("egress %s %q: want an IPv4 CIDR such as 10.1.2.0/24", what, s)
		}
		p = p.Masked()
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// ForwardJumps are the rules in the host's FORWARD chain: every packet into or out of a
// node link goes through ChainForward.
func ForwardJumps() [][]string {
	return [][]string{
		{"-i", LinkPrefix + "+", "-j", ChainForward},
		{"-o", LinkPrefix + "+", "-j", ChainForward},
	}
}

// ForwardRules are ChainForward's: replies into a node link pass, and so does what the host
// forwards to a node's published overlay endpoint (PublishOverlay); what a node link sends
// goes to its node's chain (through ChainEgress); a node link without a chain of its own
// forwards nothing, and nothing else new enters a node link.
func ForwardRules() [][]string {
	return [][]string{
		{"-o", LinkPrefix + "+", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		// A published overlay endpoint's UDP, forwarded to its node by PublishOverlay.
		{"-o", LinkPrefix + "+", "-p", "udp", "--dport", strconv.Itoa(clusternet.OverlayPort), "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"},
		{"-i", LinkPrefix + "+", "-j", ChainEgress},
		{"-i", LinkPrefix + "+", "-j", "DROP"},
		{"-o", LinkPrefix + "+", "-j", "DROP"},
	}
}

// NodeChain is the name of the host chain of the node whose host link is link.
func NodeChain(link string) string {
	return "SWN-" + strings.TrimPrefix(link, LinkPrefix)
}

// EgressJump is the rule in ChainEgress sending what link forwards to its node's chain.
func EgressJump(link string) []string {
	return []string{"-i", link, "-j", NodeChain(link)}
}

// NodeChainRules are a node's own chain, in order: the overlay's UDP to another node link;
// nothing addressed to the host itself (its INPUT filter sees those; this is for a
// forwarded one); the DNS upstreams' port; the always-denied ranges; the operator's allows; the deny list; the rest
// is accepted (and masqueraded out of the host by HostNATRules).
func NodeChainRules(p EgressPolicy) [][]string {
	rules := [][]string{
		{"-o", LinkPrefix + "+", "-d", clusternet.NodeNetwork, "-p", "udp", "--dport", strconv.Itoa(clusternet.OverlayPort), "-j", "ACCEPT"},
		{"-m", "addrtype", "--dst-type", "LOCAL", "-j", "DROP"},
	}
	for _, d := range p.DNS {
		for _, proto := range []string{"udp", "tcp"} {
			rules = append(rules, []string{"-d", d.Addr().String() + "/32", "-p", proto, "--dport", strconv.Itoa(int(d.Port())), "-j", "ACCEPT"})
		}
	}
	for _, c := range alwaysDenied {
		rules = append(rules, []string{"-d", c, "-j", "DROP"})
	}
	for _, a := range p.Allow {
		rules = append(rules, []string{"-d", a.String(), "-j", "ACCEPT"})
	}
	for _, d := range p.Deny {
		rules = append(rules, []string{"-d", d.String(), "-j", "DROP"})
	}
	return append(rules, []string{"-j", "ACCEPT"})
}

// HostNATRules are ChainHostNAT's (the host's nat POSTROUTING jumps to it): what nodes send
// out of the host leaves with the host's address; between node links nothing is rewritten.
func HostNATRules() [][]string {
	return [][]string{
		{"-s", clusternet.NodeNetwork, "-d", clusternet.NodeNetwork, "-j", "RETURN"},
		{"-s", clusternet.NodeNetwork, "-j", "MASQUERADE"},
	}
}

// NodeMasqRules are the nat rules inside a node's namespace: a pod's packet leaving by the
// node's link (eth0) for anything outside the pod and service networks takes the node's
// address. Traffic to other nodes' pods leaves by the overlay with its pod address.
func NodeMasqRules() (postrouting []string, chain [][]string) {
	return []string{"-s", clusternet.ClusterCIDR, "-o", "eth0", "-j", ChainNodeNAT},
		[][]string{
			{"-d", clusternet.ClusterCIDR, "-j", "RETURN"},
			{"-d", clusternet.ServiceCIDR, "-j", "RETURN"},
			{"-j", "MASQUERADE"},
		}
}

// HostUnreachable are the ranges the host routes nowhere (`unreachable` routes; the node
// links' /30 routes are more specific): a packet for a pod, a Service or a node that is not
// there fails on the host and never leaves by its default route.
var HostUnreachable = []string{clusternet.ClusterCIDR, clusternet.ServiceCIDR, clusternet.NodeNetwork}

// iptables runs iptables (with the xtables lock) in the host's namespace, or in the network
// namespace at netns when it is set.
func iptables(netns string, args ...string) (string, error) {
	return inNetns(netns, append([]string{"iptables", "-w"}, args...)...)
}

// inNetns runs argv in this process's network namespace, or in the one at netns.
func inNetns(netns string, argv ...string) (string, error) {
	if netns != "" {
		argv = append([]string{"nsenter", "--net=" + netns, "--"}, argv...)
	}
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// ensureChain makes chain in table hold exactly rules, in order: a chain that already does
// is left as it is (nodes being served keep their rules without a gap).
func ensureChain(netns, table, chain string, rules [][]string) error {
	if _, err := iptables(netns, "-t", table, "-N", chain); err != nil && !strings.Contains(err.Error(), "exists") {
		return err
	}
	out, err := iptables(netns, "-t", table, "-S", chain)
	if err != nil {
		return err
	}
	if sameRules(out, chain, rules) {
		return nil
	}
	if _, err := iptables(netns, "-t", table, "-F", chain); err != nil {
		return err
	}
	for _, r := range rules {
		if _, err := iptables(netns, append([]string{"-t", table, "-A", chain}, r...)...); err != nil {
			return err
		}
	}
	return nil
}

// sameRules says whether `iptables -S chain` output lists rules, in order. iptables prints a
// rule in its own canonical form, so the comparison is of the options as sets per rule.
func sameRules(listing, chain string, rules [][]string) bool {
	var got []string
	for _, l := range strings.Split(listing, "\n") {
		if rest, ok := strings.CutPrefix(l, "-A "+chain+" "); ok {
			got = append(got, canonical(strings.Fields(rest)))
		}
	}
	if len(got) != len(rules) {
		return false
	}
	for i, r := range rules {
		if got[i] != canonical(r) {
			return false
		}
	}
	return true
}

// canonical is a rule's options as sorted "flag value" pairs, addresses as CIDRs.
func canonical(args []string) string {
	var parts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		neg := ""
		if a == "!" && i+1 < len(args) {
			neg, i, a = "! ", i+1, args[i+1]
		}
		v := ""
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") && args[i+1] != "!" {
			v = args[i+1]
			i++
		}
		if (a == "-d" || a == "-s") && !strings.Contains(v, "/") {
			v += "/32"
		}
		if a == "-m" {
			continue // match module names are implied by their options
		}
		parts = append(parts, neg+a+" "+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ";")
}

// ensureJump puts rule at the top of table's chain unless it is there.
func ensureJump(netns, table, chain string, rule []string) error {
	if _, err := iptables(netns, append([]string{"-t", table, "-C", chain}, rule...)...); err == nil {
		return nil
	}
	_, err := iptables(netns, append([]string{"-t", table, "-I", chain, "1"}, rule...)...)
	return err
}

// Host is the network namespace nodes are attached to: Netns is its path, empty for this
// process's own (the bidder host's).
type Host struct {
	Netns string
}

// Ensure sets up what every node of the host shares: IPv4 forwarding on (as k3s and every
// Kubernetes network plugin set it; the FORWARD rules below decide what passes), the
// unreachable routes, the shared chains and the jumps to them. Idempotent, and safe beside
// another state dir's nodes: every one of them ensures the same.
func (h Host) Ensure() error {
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	netns := h.Netns
	for _, c := range HostUnreachable {
		if _, err := inNetns(netns, "ip", "route", "replace", "unreachable", c); err != nil {
			return err
		}
	}
	if err := ensureJumpsChain(netns, "filter", ChainEgress); err != nil {
		return err
	}
	if err := ensureChain(netns, "filter", ChainForward, ForwardRules()); err != nil {
		return err
	}
	jumps := ForwardJumps()
	for i := len(jumps) - 1; i >= 0; i-- {
		if err := ensureJump(netns, "filter", "FORWARD", jumps[i]); err != nil {
			return err
		}
	}
	if err := ensureChain(netns, "nat", ChainHostNAT, HostNATRules()); err != nil {
		return err
	}
	if err := ensureJump(netns, "nat", "POSTROUTING", []string{"-j", ChainHostNAT}); err != nil {
		return err
	}
	// Last: until the rules above are in place nothing is forwarded.
	if netns == "" {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return fmt.Errorf("net.ipv4.ip_forward: %w", err)
		}
		return nil
	}
	_, err = inNetns(netns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	return err
}

// hostLockFile serializes changes to the shared chains between every process of the host
// (bidders of several state dirs, tests): a chain is read, compared and refilled as one step.
const hostLockFile = "/run/socialweb-podnet.lock"

func lockHost() (unlock func(), err error) { return dirlock.WaitFile(hostLockFile) }

// ensureJumpsChain makes chain, one that holds the nodes' jumps (ChainEgress,
// ChainOverlayIn), in table when it is missing; it is never flushed.
func ensureJumpsChain(netns, table, chain string) error {
	if _, err := iptables(netns, "-t", table, "-N", chain); err != nil && !strings.Contains(err.Error(), "exists") {
		return err
	}
	return nil
}

// AddNode gives the node whose host link is link its own chain with policy p, and the jump
// to it. Idempotent.
func (h Host) AddNode(link string, p EgressPolicy) error {
	if !strings.HasPrefix(link, LinkPrefix) || len(link) <= len(LinkPrefix) {
		return fmt.Errorf("node link %q: want a name starting with %s", link, LinkPrefix)
	}
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	if err := ensureJumpsChain(h.Netns, "filter", ChainEgress); err != nil {
		return err
	}
	if err := ensureChain(h.Netns, "filter", NodeChain(link), NodeChainRules(p)); err != nil {
		return err
	}
	return ensureJump(h.Netns, "filter", ChainEgress, EgressJump(link))
}

// RemoveNode removes what AddNode and PublishOverlay added for link: every copy of its
// jumps, then its chains.
// Idempotent.
func (h Host) RemoveNode(link string) error {
	unlock, err := lockHost()
	if err != nil {
		return err
	}
	defer unlock()
	if err := removeChain(h.Netns, "nat", ChainOverlayIn, OverlayChain(link), []string{"-j", OverlayChain(link)}); err != nil {
		return err
	}
	return removeChain(h.Netns, "filter", ChainEgress, NodeChain(link), EgressJump(link))
}

// removeChain deletes every copy of jump from table's parent chain, then chain itself;
// either may be missing already.
func removeChain(netns, table, parent, chain string, jump []string) error {
	for i := 0; i < 8; i++ {
		if _, err := iptables(netns, append([]string{"-t", table, "-C", parent}, jump...)...); err != nil {
			break
		}
		if _, err := iptables(netns, append([]string{"-t", table, "-D", parent}, jump...)...); err != nil {
			return err
		}
	}
	if _, err := iptables(netns, "-t", table, "-S", chain); err != nil {
		return nil // no such chain
	}
	if _, err := iptables(netns, "-t", table, "-F", chain); err != nil {
		return err
	}
	_, err := iptables(netns, "-t", table, "-X", chain)
	return err
}

// EnsureNodeMasq puts NodeMasqRules in the network namespace at netns (a path).
func EnsureNodeMasq(netns string) error {
	jump, chain := NodeMasqRules()
	if err := ensureChain(netns, "nat", ChainNodeNAT, chain); err != nil {
		return err
	}
	return ensureJump(netns, "nat", "POSTROUTING", jump)
}

// Reaches reports whether the policy lets a pod reach a: never an always-denied address,
// else an allowed one, else one no deny range holds. The node chain's rules say the same
// in iptables (NodeChainRules); this is for what a node dials on a pod's behalf.
func (p EgressPolicy) Reaches(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	for _, s := range alwaysDenied {
		if netip.MustParsePrefix(s).Contains(a) {
			return false
		}
	}
	for _, allow := range p.Allow {
		if allow.Contains(a) {
			return true
		}
	}
	for _, deny := range p.Deny {
		if deny.Contains(a) {
			return false
		}
	}
	return true
}
