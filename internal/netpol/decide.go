package netpol

import (
	"net/netip"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The decision: which of this node's pods are isolated, and what each may receive and send.
// It is a pure function of the cluster's NetworkPolicies, Pods and Namespaces and the node's
// name, following the semantics of k8s.io/api/networking/v1:
//   - a pod is isolated for ingress (egress) when some policy of its namespace selects it and
//     lists Ingress (Egress) in its policyTypes; a policy without policyTypes has Ingress, and
//     Egress when it has egress rules (the API server's defaulting, repeated here);
//   - what an isolated pod may receive (send) is the union of the ingress (egress) rules of
//     every policy selecting it; a policy with the type and no rules allows nothing;
//   - a rule matches when one of its peers and one of its ports match; no peers means every
//     peer, no ports means every port;
//   - a peer is pods by podSelector in the policy's namespace, pods of the namespaces a
//     namespaceSelector picks (all of their pods, or those its podSelector picks), or an
//     ipBlock (a CIDR but its excepts);
//   - a port is a protocol (TCP when unset) with a number, a range (endPort) or a name; a
//     name is a container port of the destination pod with that name and protocol, so on
//     egress it is resolved against each peer pod, and matches nothing where no pod has it.
// Traffic between a pod and its own node is never decided here (the rules sit on the
// forward path only). Replies within a connection and related ICMP pass; every packet its
// initiator sends is decided (render.go), so a new policy ends a connection it refuses.

// Input is what the decision reads.
type Input struct {
	NodeName   string
	Policies   []*networkingv1.NetworkPolicy
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	// Learnt are addresses this node's CNI assigned, by pod UID (podgate): for a pod of
	// this node they stand instead of its status's, which lag behind the pod's start and a
	// new sandbox's address.
	Learnt map[types.UID][]netip.Addr
}

// Decision is the rule set of one node.
type Decision struct {
	// Pods are this node's isolated pods, by namespace/name.
	Pods []PodRules
}

// PodRules say what one isolated pod of this node may receive and send.
type PodRules struct {
	Pod string       // namespace/name
	IPs []netip.Addr // the pod's addresses (status.podIPs)
	// Ingress is nil when no policy isolates the pod for ingress.
	Ingress *Rules
	// Egress is nil when no policy isolates the pod for egress.
	Egress *Rules
}

// Rules are what an isolated pod allows in one direction: traffic matching any Allow
// passes, the rest is dropped. Empty Allow: nothing passes.
type Rules struct {
	Policies []string // namespace/name of the selecting policies, for the rules' comments
	Allow    []Allow
}

// Allow is one allowed (peers, ports) combination.
type Allow struct {
	Peers Peers
	// Ports: nil is every port of every protocol.
	Ports []Port
}

// Peers are the other ends a rule allows.
type Peers struct {
	All    bool         // every address
	Addrs  []netip.Addr // pods' addresses
	Blocks []Block      // ipBlocks
}

// Block is a CIDR without its excepts.
type Block struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// Port is a protocol with a port or a range of them; Port 0 is every port of Protocol.
type Port struct {
	Protocol corev1.Protocol
	Port     int32
	EndPort  int32 // 0 unless a range
}

// Decide computes the rule set of in.NodeName's pods.
func Decide(in Input) Decision {
	v := newView(in)
	var d Decision
	for _, p := range v.pods {
		if p.pod.Spec.NodeName != in.NodeName {
			continue
		}
		pr := PodRules{Pod: p.key, IPs: p.ips}
		for _, pol := range v.policies {
			if pol.Namespace != p.pod.Namespace || !v.selects(&pol.Spec.PodSelector, p.pod.Labels) {
				continue
			}
			ingress, egress := policyTypes(pol)
			name := pol.Namespace + "/" + pol.Name
			if ingress {
				if pr.Ingress == nil {
					pr.Ingress = &Rules{}
				}
				pr.Ingress.Policies = append(pr.Ingress.Policies, name)
				for _, r := range pol.Spec.Ingress {
					pr.Ingress.Allow = append(pr.Ingress.Allow, v.ingressAllows(pol, r.From, r.Ports, p)...)
				}
			}
			if egress {
				if pr.Egress == nil {
					pr.Egress = &Rules{}
				}
				pr.Egress.Policies = append(pr.Egress.Policies, name)
				for i := range pol.Spec.Egress {
					pr.Egress.Allow = append(pr.Egress.Allow, v.egressAllows(pol, &pol.Spec.Egress[i])...)
				}
			}
		}
		if pr.Ingress != nil || pr.Egress != nil {
			d.Pods = append(d.Pods, pr)
		}
	}
	return d
}

// podView is a pod that has addresses and takes part in the pod network.
type podView struct {
	key string
	pod *corev1.Pod
	ips []netip.Addr
}

type view struct {
	pods     []podView // sorted by key
	nsLabels map[string]labels.Set
	policies []*networkingv1.NetworkPolicy // sorted by namespace/name
	// Parsed selectors and each rule's peers, made once per decision: a rule's peers do
	// not depend on which of the node's pods it is decided for.
	selectors map[*metav1.LabelSelector]labels.Selector
	peerCache map[*networkingv1.NetworkPolicyPeer]peersAndPods
	// An egress rule's allows are the same for every pod it applies to.
	egressCache map[*networkingv1.NetworkPolicyEgressRule][]Allow
}

type peersAndPods struct {
	peers Peers
	pods  []podView
}

func newView(in Input) *view {
	v := &view{
		nsLabels:  map[string]labels.Set{},
		selectors: map[*metav1.LabelSelector]labels.Selector{},
		peerCache: map[*networkingv1.NetworkPolicyPeer]peersAndPods{},

		egressCache: map[*networkingv1.NetworkPolicyEgressRule][]Allow{},
	}
	for _, ns := range in.Namespaces {
		v.nsLabels[ns.Name] = labels.Set(ns.Labels)
	}
	for _, p := range in.Pods {
		// Host-network pods have their node's address: what reaches them is the node's
		// traffic. Finished pods' addresses may already be another pod's.
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ips := podIPs(p)
		if l, ok := in.Learnt[p.UID]; ok && p.Spec.NodeName == in.NodeName {
			ips = l
		}
		if len(ips) == 0 {
			continue
		}
		v.pods = append(v.pods, podView{key: p.Namespace + "/" + p.Name, pod: p, ips: ips})
	}
	sort.Slice(v.pods, func(i, j int) bool { return v.pods[i].key < v.pods[j].key })
	v.policies = slices.Clone(in.Policies)
	sort.Slice(v.policies, func(i, j int) bool {
		a, b := v.policies[i], v.policies[j]
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	return v
}

func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return
		}
		a = a.Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	if p.Status.PodIP != "" {
		add(p.Status.PodIP)
	}
	return out
}

// policyTypes says whether pol isolates for ingress and for egress.
func policyTypes(pol *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(pol.Spec.PolicyTypes) == 0 {
		return true, len(pol.Spec.Egress) > 0
	}
	for _, t := range pol.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// selects reports whether sel matches set. A selector that does not parse matches
// nothing: for a policy's podSelector that isolates nothing, for a peer it allows nothing.
func (v *view) selects(sel *metav1.LabelSelector, set map[string]string) bool {
	s, ok := v.selectors[sel]
	if !ok {
		var err error
		if s, err = metav1.LabelSelectorAsSelector(sel); err != nil {
			s = labels.Nothing()
		}
		v.selectors[sel] = s
	}
	return s.Matches(labels.Set(set))
}

// peerPods are the pods a selector peer picks; ok is false for an ipBlock peer.
func (v *view) peerPods(pol *networkingv1.NetworkPolicy, peer networkingv1.NetworkPolicyPeer) ([]podView, bool) {
	if peer.PodSelector == nil && peer.NamespaceSelector == nil {
		return nil, false
	}
	var out []podView
	for _, p := range v.pods {
		if peer.NamespaceSelector == nil {
			if p.pod.Namespace != pol.Namespace {
				continue
			}
		} else if !v.selects(peer.NamespaceSelector, v.nsLabels[p.pod.Namespace]) {
			continue
		}
		if peer.PodSelector != nil && !v.selects(peer.PodSelector, p.pod.Labels) {
			continue
		}
		out = append(out, p)
	}
	return out, true
}

// peers are the Peers of a rule's from or to list; empty means every peer. It also
// returns the pods those peers are (for named ports on egress): every pod for no peers, the
// selected pods, and the pods whose addresses an ipBlock allows.
func (v *view) peers(pol *networkingv1.NetworkPolicy, list []networkingv1.NetworkPolicyPeer) (Peers, []podView) {
	if len(list) == 0 {
		return Peers{All: true}, v.pods
	}
	if c, ok := v.peerCache[&list[0]]; ok {
		return c.peers, c.pods
	}
	var ps Peers
	seen := map[string]bool{}
	var pods []podView
	addPod := func(p podView) {
		if !seen[p.key] {
			seen[p.key] = true
			pods = append(pods, p)
		}
	}
	for _, peer := range list {
		if sel, ok := v.peerPods(pol, peer); ok {
			for _, p := range sel {
				addPod(p)
				ps.Addrs = append(ps.Addrs, p.ips...)
			}
			continue
		}
		if peer.IPBlock == nil {
			continue // validation forbids an empty peer; it allows nothing
		}
		b, ok := parseBlock(peer.IPBlock)
		if !ok {
			continue
		}
		ps.Blocks = append(ps.Blocks, b)
		// The pods inside the block, for named ports: not added to Addrs, the block
		// itself matches them.
		for _, p := range v.pods {
			for _, ip := range p.ips {
				if b.contains(ip) {
					addPod(p)
					break
				}
			}
		}
	}
	ps.Addrs = sortedAddrs(ps.Addrs)
	sort.Slice(pods, func(i, j int) bool { return pods[i].key < pods[j].key })
	v.peerCache[&list[0]] = peersAndPods{ps, pods}
	return ps, pods
}

func parseBlock(b *networkingv1.IPBlock) (Block, bool) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return Block{}, false
	}
	out := Block{CIDR: cidr.Masked()}
	for _, e := range b.Except {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			// An except we cannot read: drop the block rather than allow too much.
			return Block{}, false
		}
		out.Except = append(out.Except, p.Masked())
	}
	return out, true
}

func (b Block) contains(a netip.Addr) bool {
	if !b.CIDR.Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

func sortedAddrs(as []netip.Addr) []netip.Addr {
	if len(as) == 0 {
		return nil
	}
	slices.SortFunc(as, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(as)
}

// numericPorts splits a rule's ports into numbered ones (with their protocol) and named
// ones; every is true when the rule lists no ports.
func numericPorts(ports []networkingv1.NetworkPolicyPort) (nums []Port, named []namedPort, every bool) {
	if len(ports) == 0 {
		return nil, nil, true
	}
	for _, p := range ports {
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		switch {
		case p.Port == nil:
			nums = append(nums, Port{Protocol: proto})
		case p.Port.Type == intstr.String:
			named = append(named, namedPort{proto: proto, name: p.Port.StrVal})
		default:
			np := Port{Protocol: proto, Port: p.Port.IntVal}
			if p.EndPort != nil && *p.EndPort > np.Port {
				np.EndPort = *p.EndPort
			}
			nums = append(nums, np)
		}
	}
	return nums, named, false
}

type namedPort struct {
	proto corev1.Protocol
	name  string
}

// resolve finds the container port of pod named np.name with protocol np.proto.
func (np namedPort) resolve(pod *corev1.Pod) (Port, bool) {
	for _, c := range pod.Spec.Containers {
		for _, cp := range c.Ports {
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if cp.Name == np.name && proto == np.proto {
				return Port{Protocol: proto, Port: cp.ContainerPort}, true
			}
		}
	}
	return Port{}, false
}

// ingressAllows compiles one ingress rule of pol for the destination pod dst.
func (v *view) ingressAllows(pol *networkingv1.NetworkPolicy, from []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, dst podView) []Allow {
	peers, _ := v.peers(pol, from)
	if peers.empty() {
		return nil
	}
	nums, named, every := numericPorts(ports)
	if every {
		return []Allow{{Peers: peers}}
	}
	for _, n := range named {
		if p, ok := n.resolve(dst.pod); ok {
			nums = append(nums, p)
		}
	}
	if len(nums) == 0 {
		return nil
	}
	return []Allow{{Peers: peers, Ports: sortedPorts(nums)}}
}

// egressAllows compiles one egress rule of pol: named ports are the destinations' own, so
// each is resolved per peer pod, and the pods are grouped by the number it resolves to.
func (v *view) egressAllows(pol *networkingv1.NetworkPolicy, r *networkingv1.NetworkPolicyEgressRule) []Allow {
	if a, ok := v.egressCache[r]; ok {
		return a
	}
	a := v.compileEgress(pol, r.To, r.Ports)
	v.egressCache[r] = a
	return a
}

func (v *view) compileEgress(pol *networkingv1.NetworkPolicy, to []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) []Allow {
	peers, pods := v.peers(pol, to)
	nums, named, every := numericPorts(ports)
	if every {
		if peers.empty() {
			return nil
		}
		return []Allow{{Peers: peers}}
	}
	var out []Allow
	if len(nums) > 0 && !peers.empty() {
		out = append(out, Allow{Peers: peers, Ports: sortedPorts(nums)})
	}
	byPort := map[Port][]netip.Addr{}
	for _, n := range named {
		for _, p := range pods {
			if port, ok := n.resolve(p.pod); ok {
				byPort[port] = append(byPort[port], p.ips...)
			}
		}
	}
	keys := make([]Port, 0, len(byPort))
	for k := range byPort {
		keys = append(keys, k)
	}
	keys = sortedPorts(keys)
	for _, k := range keys {
		out = append(out, Allow{Peers: Peers{Addrs: sortedAddrs(byPort[k])}, Ports: []Port{k}})
	}
	return out
}

func (p Peers) empty() bool { return !p.All && len(p.Addrs) == 0 && len(p.Blocks) == 0 }

func sortedPorts(ps []Port) []Port {
	slices.SortFunc(ps, func(a, b Port) int {
		if c := strings.Compare(string(a.Protocol), string(b.Protocol)); c != 0 {
			return c
		}
		if a.Port != b.Port {
			return int(a.Port - b.Port)
		}
		return int(a.EndPort - b.EndPort)
	})
	return slices.Compact(ps)
}
