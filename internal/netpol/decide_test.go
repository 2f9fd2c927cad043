package netpol

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const self = "node-a"

type podOpt func(*corev1.Pod)

func pod(ns, name, node, ip string, lbl map[string]string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
	if ip != "" {
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func withPort(name string, proto corev1.Protocol, port int32) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "c" + name,
			Ports: []corev1.ContainerPort{{Name: name, Protocol: proto, ContainerPort: port}}})
	}
}

func namespace(name string, lbl map[string]string) *corev1.Namespace {
	l := map[string]string{"kubernetes.io/metadata.name": name}
	for k, v := range lbl {
		l[k] = v
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
}

func policy(ns, name string, sel map[string]string, mut func(*networkingv1.NetworkPolicySpec)) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: sel}},
	}
	mut(&p.Spec)
	return p
}

func labelSel(l map[string]string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: l}
}

func tcp(port int32) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(port)
	return networkingv1.NetworkPolicyPort{Port: &p}
}

func proto(pr corev1.Protocol, port int32, end int32) networkingv1.NetworkPolicyPort {
	pp := pr
	np := networkingv1.NetworkPolicyPort{Protocol: &pp}
	if port != 0 {
		p := intstr.FromInt32(port)
		np.Port = &p
	}
	if end != 0 {
		np.EndPort = &end
	}
	return np
}

func named(name string) networkingv1.NetworkPolicyPort {
	p := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &p}
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func ingressOnly(r ...networkingv1.NetworkPolicyIngressRule) func(*networkingv1.NetworkPolicySpec) {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		s.Ingress = r
	}
}

func egressOnly(r ...networkingv1.NetworkPolicyEgressRule) func(*networkingv1.NetworkPolicySpec) {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		s.Egress = r
	}
}

// The cluster every case reads: web and a client here, another client and a pod of
// namespace "other" on another node.
var (
	web      = pod("default", "web", self, "10.88.0.2", map[string]string{"app": "web"}, withPort("http", corev1.ProtocolTCP, 8080))
	client   = pod("default", "client", self, "10.88.0.3", map[string]string{"role": "client"})
	client2  = pod("default", "client2", "node-b", "10.88.1.3", map[string]string{"role": "client"}, withPort("http", corev1.ProtocolTCP, 9090))
	otherPod = pod("other", "o", "node-b", "10.88.1.4", map[string]string{"role": "client"}, withPort("http", corev1.ProtocolTCP, 8080))
	basePods = []*corev1.Pod{web, client, client2, otherPod}
	baseNS   = []*corev1.Namespace{namespace("default", nil), namespace("other", map[string]string{"team": "blue"})}
)

func TestDecide(t *testing.T) {
	webFromClients := policy("default", "web-from-clients", map[string]string{"app": "web"}, ingressOnly(
		networkingv1.NetworkPolicyIngressRule{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel(map[string]string{"role": "client"})}},
			Ports: []networkingv1.NetworkPolicyPort{tcp(8080)},
		}))
	tests := []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		pods     []*corev1.Pod
		want     []PodRules
	}{
		{name: "no policy isolates nothing"},
		{
			name:     "podSelector peer: pods of the policy's namespace only, on any node",
			policies: []*networkingv1.NetworkPolicy{webFromClients},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/web-from-clients"},
				Allow:    []Allow{{Peers: Peers{Addrs: addrs("10.88.0.3", "10.88.1.3")}, Ports: []Port{{Protocol: "TCP", Port: 8080}}}},
			}}},
		},
		{
			name: "a policy with the type and no rules allows nothing",
			policies: []*networkingv1.NetworkPolicy{policy("default", "deny", nil, func(s *networkingv1.NetworkPolicySpec) {
				s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			})},
			want: []PodRules{
				{Pod: "default/client", IPs: addrs("10.88.0.3"), Ingress: &Rules{Policies: []string{"default/deny"}}, Egress: &Rules{Policies: []string{"default/deny"}}},
				{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{Policies: []string{"default/deny"}}, Egress: &Rules{Policies: []string{"default/deny"}}},
			},
		},
		{
			name: "no policyTypes: Ingress always, Egress only with egress rules",
			policies: []*networkingv1.NetworkPolicy{
				policy("default", "a", map[string]string{"app": "web"}, func(s *networkingv1.NetworkPolicySpec) {}),
				policy("default", "b", map[string]string{"role": "client"}, func(s *networkingv1.NetworkPolicySpec) {
					s.Egress = []networkingv1.NetworkPolicyEgressRule{{}}
				}),
			},
			want: []PodRules{
				{Pod: "default/client", IPs: addrs("10.88.0.3"),
					Ingress: &Rules{Policies: []string{"default/b"}},
					Egress:  &Rules{Policies: []string{"default/b"}, Allow: []Allow{{Peers: Peers{All: true}}}}},
				{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{Policies: []string{"default/a"}}},
			},
		},
		{
			name: "egress only leaves ingress open; a policy of another namespace selects nothing here",
			policies: []*networkingv1.NetworkPolicy{
				policy("default", "e", map[string]string{"app": "web"}, egressOnly()),
				policy("other", "x", nil, ingressOnly()),
			},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Egress: &Rules{Policies: []string{"default/e"}}}},
		},
		{
			name: "the selecting policies' rules are a union",
			policies: []*networkingv1.NetworkPolicy{
				webFromClients,
				policy("default", "all-on-9000", map[string]string{"app": "web"}, ingressOnly(
					networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{tcp(9000)}})),
			},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/all-on-9000", "default/web-from-clients"},
				Allow: []Allow{
					{Peers: Peers{All: true}, Ports: []Port{{Protocol: "TCP", Port: 9000}}},
					{Peers: Peers{Addrs: addrs("10.88.0.3", "10.88.1.3")}, Ports: []Port{{Protocol: "TCP", Port: 8080}}},
				},
			}}},
		},
		{
			name: "namespaceSelector alone: every pod of the namespaces it picks",
			policies: []*networkingv1.NetworkPolicy{policy("default", "from-blue", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labelSel(map[string]string{"team": "blue"})}}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/from-blue"},
				Allow:    []Allow{{Peers: Peers{Addrs: addrs("10.88.1.4")}}},
			}}},
		},
		{
			name: "namespaceSelector {} and podSelector in one peer: those pods of every namespace",
			policies: []*networkingv1.NetworkPolicy{policy("default", "clients-anywhere", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{},
					PodSelector:       labelSel(map[string]string{"role": "client"}),
				}}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/clients-anywhere"},
				Allow:    []Allow{{Peers: Peers{Addrs: addrs("10.88.0.3", "10.88.1.3", "10.88.1.4")}}},
			}}},
		},
		{
			name: "the two selectors in two peers: either",
			policies: []*networkingv1.NetworkPolicy{policy("default", "two", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{
					{NamespaceSelector: labelSel(map[string]string{"team": "red"})},
					{PodSelector: labelSel(map[string]string{"role": "client"})},
				}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/two"},
				Allow:    []Allow{{Peers: Peers{Addrs: addrs("10.88.0.3", "10.88.1.3")}}},
			}}},
		},
		{
			name: "a peer selecting no pod allows nothing",
			policies: []*networkingv1.NetworkPolicy{policy("default", "none", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel(map[string]string{"role": "nobody"})}}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{Policies: []string{"default/none"}}}},
		},
		{
			name: "ipBlock with except",
			policies: []*networkingv1.NetworkPolicy{policy("default", "block", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.128/25"}}}}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/block"},
				Allow: []Allow{{Peers: Peers{Blocks: []Block{{
					CIDR: netip.MustParsePrefix("192.0.2.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("192.0.2.128/25")},
				}}}}},
			}}},
		},
		{
			name: "ports: protocols, a range, every port of a protocol",
			policies: []*networkingv1.NetworkPolicy{policy("default", "ports", map[string]string{"app": "web"}, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{
					proto(corev1.ProtocolUDP, 53, 0), proto(corev1.ProtocolTCP, 8000, 8100), proto(corev1.ProtocolSCTP, 0, 0),
				}}))},
			want: []PodRules{{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
				Policies: []string{"default/ports"},
				Allow: []Allow{{Peers: Peers{All: true}, Ports: []Port{
					{Protocol: "SCTP"}, {Protocol: "TCP", Port: 8000, EndPort: 8100}, {Protocol: "UDP", Port: 53},
				}}},
			}}},
		},
		{
			name: "ingress named port: the destination pod's own container port, by name and protocol",
			policies: []*networkingv1.NetworkPolicy{policy("default", "named", nil, ingressOnly(
				networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{named("http")}},
				networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{func() networkingv1.NetworkPolicyPort {
					p := named("http")
					udp := corev1.ProtocolUDP
					p.Protocol = &udp
					return p
				}()}},
			))},
			// client has no port named http: isolated, and nothing is allowed in.
			want: []PodRules{
				{Pod: "default/client", IPs: addrs("10.88.0.3"), Ingress: &Rules{Policies: []string{"default/named"}}},
				{Pod: "default/web", IPs: addrs("10.88.0.2"), Ingress: &Rules{
					Policies: []string{"default/named"},
					Allow:    []Allow{{Peers: Peers{All: true}, Ports: []Port{{Protocol: "TCP", Port: 8080}}}},
				}},
			},
		},
		{
			name: "egress named port: resolved against each destination pod, grouped by number",
			policies: []*networkingv1.NetworkPolicy{policy("default", "to-http", map[string]string{"role": "client"}, egressOnly(
				networkingv1.NetworkPolicyEgressRule{
					To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
					Ports: []networkingv1.NetworkPolicyPort{named("http"), proto(corev1.ProtocolUDP, 53, 0)},
				}))},
			want: []PodRules{{Pod: "default/client", IPs: addrs("10.88.0.3"), Egress: &Rules{
				Policies: []string{"default/to-http"},
				Allow: []Allow{
					{Peers: Peers{Addrs: addrs("10.88.0.2", "10.88.0.3", "10.88.1.3", "10.88.1.4")}, Ports: []Port{{Protocol: "UDP", Port: 53}}},
					{Peers: Peers{Addrs: addrs("10.88.0.2", "10.88.1.4")}, Ports: []Port{{Protocol: "TCP", Port: 8080}}},
					{Peers: Peers{Addrs: addrs("10.88.1.3")}, Ports: []Port{{Protocol: "TCP", Port: 9090}}},
				},
			}}},
		},
		{
			name: "egress named port to an ipBlock: the pods inside it that have the port",
			policies: []*networkingv1.NetworkPolicy{policy("default", "block-http", map[string]string{"role": "client"}, egressOnly(
				networkingv1.NetworkPolicyEgressRule{
					To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.88.1.0/24", Except: []string{"10.88.1.3/32"}}}},
					Ports: []networkingv1.NetworkPolicyPort{named("http")},
				}))},
			want: []PodRules{{Pod: "default/client", IPs: addrs("10.88.0.3"), Egress: &Rules{
				Policies: []string{"default/block-http"},
				Allow:    []Allow{{Peers: Peers{Addrs: addrs("10.88.1.4")}, Ports: []Port{{Protocol: "TCP", Port: 8080}}}},
			}}},
		},
		{
			name:     "host-network and finished pods are neither isolated nor peers; pods without an address are not isolated",
			policies: []*networkingv1.NetworkPolicy{webFromClients, policy("default", "all", nil, ingressOnly())},
			pods: []*corev1.Pod{
				pod("default", "web", self, "", map[string]string{"app": "web"}),
				pod("default", "hostnet", self, "192.0.2.10", map[string]string{"role": "client"}, func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
				pod("default", "done", "node-b", "10.88.1.9", map[string]string{"role": "client"}, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				pod("default", "c", self, "10.88.0.5", map[string]string{"role": "client"}),
			},
			want: []PodRules{{Pod: "default/c", IPs: addrs("10.88.0.5"), Ingress: &Rules{Policies: []string{"default/all"}}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := tt.pods
			if pods == nil {
				pods = basePods
			}
			got := Decide(Input{NodeName: self, Policies: tt.policies, Pods: pods, Namespaces: baseNS})
			if diff := cmp.Diff(tt.want, got.Pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

// The pods the informer keeps are decided as the pods the apiserver sends.
func TestPodForDecisionKeepsWhatDecideReads(t *testing.T) {
	full := pod("default", "web", self, "10.88.0.2", map[string]string{"app": "web"}, withPort("http", corev1.ProtocolTCP, 8080))
	full.Annotations = map[string]string{"big": strings.Repeat("x", 1000)}
	full.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	full.Spec.Containers = append(full.Spec.Containers, corev1.Container{Name: "sidecar", Image: "x", Env: []corev1.EnvVar{{Name: "A", Value: "b"}}})
	kept, err := podForDecision(full)
	if err != nil {
		t.Fatal(err)
	}
	k := kept.(*corev1.Pod)
	if k.Annotations != nil || k.ManagedFields != nil || len(k.Spec.Containers) != 1 {
		t.Errorf("kept more than Decide reads: %+v", k)
	}
	policies := []*networkingv1.NetworkPolicy{policy("default", "named", nil, ingressOnly(
		networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{named("http")}}))}
	want := Decide(Input{NodeName: self, Pods: []*corev1.Pod{full}, Namespaces: baseNS, Policies: policies})
	got := Decide(Input{NodeName: self, Pods: []*corev1.Pod{k}, Namespaces: baseNS, Policies: policies})
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("decided otherwise on the kept pod (-full +kept):\n%s", diff)
	}
}
