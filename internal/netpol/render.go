package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// The rendering: one table, inet socialweb-netpol, in the node's network namespace.
//
//	chain forward: hook forward, priority filter, policy accept
//	  ct direction reply accept
//	  ct state related accept
//	  ip saddr vmap @egress-ip4     (and ip6 ... @egress-ip6)
//	  ip daddr vmap @ingress-ip4    (and ip6 ... @ingress-ip6)
//	map egress-ip4 { pod address : jump egress-<hash> }   (isolated pods of this node only)
//	chain egress-<hash>: one "... return" rule per allowed (peers, ports), then "counter drop"
//
// A packet from an isolated pod goes through its egress chain, and one to an isolated pod
// through its ingress chain; each returns when the packet is allowed and drops it
// otherwise, so a packet between two isolated pods of the node passes both. Only addresses
// of this node's pods are keys of the maps: the node's own traffic, the overlay's and other
// pods' is never matched. The node's own traffic to its pods (the kubelet's probes) is
// output, not forward, and never reaches the chain. Pods with the same rules share one
// chain (named by a hash of its rules).
//
// Every packet a connection's initiator sends is decided, not only its first: a policy
// written while a connection is open ends it (its next packet is dropped), as if the
// connection were opened then. What the other end sends back (conntrack's reply direction)
// is part of an allowed connection and passes, as do ICMP errors about one.
//
// Every change rewrites the whole table in one nft transaction (add, delete, add again):
// the kernel swaps the old rules for the new atomically, and no chain of a pod that is gone
// is left behind.

// TableName is the nftables table of the rules in the node's namespace.
const TableName = "socialweb-netpol"

const forwardChain = "forward"

// fill adds to tx the commands that replace the table with d's rules.
func fill(tx *knftables.Transaction, d Decision) {
	table := &knftables.Table{Comment: knftables.PtrTo("NetworkPolicy of this node's pods (socialweb kube netpol)")}
	tx.Add(table)
	tx.Delete(table)
	tx.Add(table)
	tx.Add(&knftables.Chain{
		Name:     forwardChain,
		Type:     knftables.PtrTo(knftables.FilterType),
		Hook:     knftables.PtrTo(knftables.ForwardHook),
		Priority: knftables.PtrTo(knftables.FilterPriority),
	})
	tx.Add(&knftables.Rule{Chain: forwardChain, Rule: "ct direction reply accept"})
	tx.Add(&knftables.Rule{Chain: forwardChain, Rule: "ct state related accept"})
	for _, dir := range []string{"egress", "ingress"} {
		addr := "saddr"
		if dir == "ingress" {
			addr = "daddr"
		}
		tx.Add(&knftables.Map{Name: dir + "-ip4", Type: "ipv4_addr : verdict"})
		tx.Add(&knftables.Map{Name: dir + "-ip6", Type: "ipv6_addr : verdict"})
		tx.Add(&knftables.Rule{Chain: forwardChain, Rule: fmt.Sprintf("ip %s vmap @%s-ip4", addr, dir)})
		tx.Add(&knftables.Rule{Chain: forwardChain, Rule: fmt.Sprintf("ip6 %s vmap @%s-ip6", addr, dir)})
	}

	chains := map[string]bool{}
	keyed := map[string]bool{}
	for _, p := range d.Pods {
		for _, dir := range []string{"ingress", "egress"} {
			r := p.Ingress
			if dir == "egress" {
				r = p.Egress
			}
			if r == nil {
				continue
			}
			rules := chainRules(dir, *r)
			name := chainName(dir, append(rules, r.Policies...))
			if !chains[name] {
				chains[name] = true
				tx.Add(&knftables.Chain{Name: name, Comment: knftables.PtrTo(truncate(strings.Join(r.Policies, ","), 128))})
				for _, rule := range rules {
					tx.Add(&knftables.Rule{Chain: name, Rule: rule})
				}
			}
			for _, ip := range p.IPs {
				m := dir + "-ip4"
				if ip.Is6() {
					m = dir + "-ip6"
				}
				// Two pods of one node never share an address, but the informers may
				// see a new pod before an old one with its address is gone: the first
				// (by name) keeps it until then.
				if keyed[m+ip.String()] {
					continue
				}
				keyed[m+ip.String()] = true
				tx.Add(&knftables.Element{
					Map: m, Key: []string{ip.String()}, Value: []string{"jump " + name},
					Comment: knftables.PtrTo(truncate(p.Pod, 128)),
				})
			}
		}
	}
}

// chainRules are the rules of one pod chain: the allowed traffic returns, the rest drops.
func chainRules(dir string, r Rules) []string {
	addr := "saddr"
	if dir == "egress" {
		addr = "daddr"
	}
	var out []string
	seen := map[string]bool{}
	for _, a := range r.Allow {
		for _, peer := range peerMatches(addr, a.Peers) {
			for _, port := range portMatches(a.Ports) {
				rule := strings.TrimSpace(strings.Join([]string{peer, port, "return"}, " "))
				rule = strings.Join(strings.Fields(rule), " ")
				if !seen[rule] {
					seen[rule] = true
					out = append(out, rule)
				}
			}
		}
	}
	return append(out, "counter drop")
}

// peerMatches are the alternative matches of peers ("" matches every address).
func peerMatches(addr string, p Peers) []string {
	if p.All {
		return []string{""}
	}
	var out []string
	var v4, v6 []string
	for _, a := range p.Addrs {
		if a.Is4() {
			v4 = append(v4, a.String())
		} else {
			v6 = append(v6, a.String())
		}
	}
	if len(v4) > 0 {
		out = append(out, fmt.Sprintf("ip %s { %s }", addr, strings.Join(v4, ", ")))
	}
	if len(v6) > 0 {
		out = append(out, fmt.Sprintf("ip6 %s { %s }", addr, strings.Join(v6, ", ")))
	}
	for _, b := range p.Blocks {
		fam := "ip"
		if b.CIDR.Addr().Is6() {
			fam = "ip6"
		}
		m := fmt.Sprintf("%s %s %s", fam, addr, b.CIDR)
		var except []string
		for _, e := range b.Except {
			if e.Addr().Is6() == b.CIDR.Addr().Is6() && e.Overlaps(b.CIDR) {
				except = append(except, e.String())
			}
		}
		if len(except) > 0 {
			m += fmt.Sprintf(" %s %s != { %s }", fam, addr, strings.Join(except, ", "))
		}
		out = append(out, m)
	}
	return out
}

// portMatches are the alternative matches of ports, one per protocol ("" matches every
// packet).
func portMatches(ports []Port) []string {
	if ports == nil {
		return []string{""}
	}
	byProto := map[corev1.Protocol][]string{}
	every := map[corev1.Protocol]bool{}
	for _, p := range ports {
		switch {
		case p.Port == 0:
			every[p.Protocol] = true
		case p.EndPort > p.Port:
			byProto[p.Protocol] = append(byProto[p.Protocol], fmt.Sprintf("%d-%d", p.Port, p.EndPort))
		default:
			byProto[p.Protocol] = append(byProto[p.Protocol], fmt.Sprint(p.Port))
		}
	}
	protos := map[corev1.Protocol]bool{}
	for _, p := range ports {
		protos[p.Protocol] = true
	}
	var names []string
	for p := range protos {
		names = append(names, string(p))
	}
	sort.Strings(names)
	var out []string
	for _, n := range names {
		proto := corev1.Protocol(n)
		l4, ok := protocolNumbers[proto]
		if !ok {
			continue // the API knows no other protocol
		}
		if every[proto] {
			out = append(out, "meta l4proto "+l4)
			continue
		}
		out = append(out, fmt.Sprintf("meta l4proto %s th dport { %s }", l4, strings.Join(byProto[proto], ", ")))
	}
	return out
}

// protocolNumbers are the IP protocol numbers of the API's protocols. nft is given numbers,
// not names: a name is looked up in /etc/protocols, which a node's root does not have.
var protocolNumbers = map[corev1.Protocol]string{
	corev1.ProtocolTCP:  "6",
	corev1.ProtocolUDP:  "17",
	corev1.ProtocolSCTP: "132",
}

// chainName names a pod chain by its direction and a hash of its rules and policies.
func chainName(dir string, rules []string) string {
	h := sha256.Sum256([]byte(strings.Join(rules, "\n")))
	return dir + "-" + hex.EncodeToString(h[:])[:16]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// script renders d as the nft commands fill would run, for logs and tests.
func script(d Decision) string {
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	tx := fake.NewTransaction()
	fill(tx, d)
	return tx.String()
}
