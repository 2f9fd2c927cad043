package netpol

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestChainRules(t *testing.T) {
	tests := []struct {
		name string
		dir  string
		r    Rules
		want []string
	}{
		{name: "nothing allowed", dir: "ingress", want: []string{"counter drop"}},
		{
			name: "every peer, every port",
			dir:  "egress",
			r:    Rules{Allow: []Allow{{Peers: Peers{All: true}}}},
			want: []string{"return", "counter drop"},
		},
		{
			name: "pods of both families, ports of two protocols; ingress matches the source",
			dir:  "ingress",
			r: Rules{Allow: []Allow{{
				Peers: Peers{Addrs: addrs("10.88.0.3", "10.88.1.3", "fd00::3")},
				Ports: []Port{{Protocol: "TCP", Port: 80}, {Protocol: "TCP", Port: 8000, EndPort: 8100}, {Protocol: "UDP"}},
			}}},
			want: []string{
				"ip saddr { 10.88.0.3, 10.88.1.3 } meta l4proto 6 th dport { 80, 8000-8100 } return",
				"ip saddr { 10.88.0.3, 10.88.1.3 } meta l4proto 17 return",
				"ip6 saddr { fd00::3 } meta l4proto 6 th dport { 80, 8000-8100 } return",
				"ip6 saddr { fd00::3 } meta l4proto 17 return",
				"counter drop",
			},
		},
		{
			name: "an ipBlock's excepts; egress matches the destination",
			dir:  "egress",
			r: Rules{Allow: []Allow{{Peers: Peers{Blocks: []Block{{
				CIDR:   netip.MustParsePrefix("192.0.2.0/24"),
				Except: []netip.Prefix{netip.MustParsePrefix("192.0.2.128/25"), netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("fd00::/8")},
			}}}, Ports: []Port{{Protocol: "SCTP", Port: 5000}}}}},
			want: []string{
				"ip daddr 192.0.2.0/24 ip daddr != { 192.0.2.128/25 } meta l4proto 132 th dport { 5000 } return",
				"counter drop",
			},
		},
		{
			name: "two equal allows make one rule",
			dir:  "ingress",
			r:    Rules{Allow: []Allow{{Peers: Peers{All: true}}, {Peers: Peers{All: true}}}},
			want: []string{"return", "counter drop"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, chainRules(tt.dir, tt.r)); diff != "" {
				t.Errorf("chainRules (-want +got):\n%s", diff)
			}
		})
	}
}

// TestScriptShape: the forward chain checks the source pod's egress before the
// destination pod's ingress, only this node's isolated pods are keys, and pods with the
// same rules share a chain.
func TestScriptShape(t *testing.T) {
	r := &Rules{Policies: []string{"default/p"}, Allow: []Allow{{Peers: Peers{All: true}, Ports: []Port{{Protocol: "TCP", Port: 80}}}}}
	s := script(Decision{Pods: []PodRules{
		{Pod: "default/a", IPs: addrs("10.88.0.2"), Ingress: r},
		{Pod: "default/b", IPs: addrs("10.88.0.3", "fd00::3"), Ingress: r, Egress: &Rules{Policies: []string{"default/q"}}},
	}})
	for _, want := range []string{
		"add rule inet socialweb-netpol forward ct direction reply accept\n" +
			"add rule inet socialweb-netpol forward ct state related accept\n" +
			"add map inet socialweb-netpol egress-ip4 { type ipv4_addr : verdict ; }\n" +
			"add map inet socialweb-netpol egress-ip6 { type ipv6_addr : verdict ; }\n" +
			"add rule inet socialweb-netpol forward ip saddr vmap @egress-ip4\n" +
			"add rule inet socialweb-netpol forward ip6 saddr vmap @egress-ip6\n" +
			"add map inet socialweb-netpol ingress-ip4 { type ipv4_addr : verdict ; }\n" +
			"add map inet socialweb-netpol ingress-ip6 { type ipv6_addr : verdict ; }\n" +
			"add rule inet socialweb-netpol forward ip daddr vmap @ingress-ip4\n" +
			"add rule inet socialweb-netpol forward ip6 daddr vmap @ingress-ip6\n",
		"add element inet socialweb-netpol egress-ip6 { fd00::3 comment \"default/b\" : jump egress-",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the script lacks\n%s\nin\n%s", want, s)
		}
	}
	if n := strings.Count(s, "add chain inet socialweb-netpol ingress-"); n != 1 {
		t.Errorf("%d ingress chains, want 1 shared by both pods:\n%s", n, s)
	}
	if n := strings.Count(s, "add element inet socialweb-netpol ingress-ip4"); n != 2 {
		t.Errorf("%d ingress-ip4 elements, want 2:\n%s", n, s)
	}
}

// TestScriptLoads loads a rendering of every kind of match into the kernel, in a network
// namespace of its own, twice (the second replaces the first), with the nft the nodes run.
func TestScriptLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft (hack/install-guest-deps.sh installs it)")
	}
	ns := "swnetpol-test"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	d := Decide(Input{NodeName: self, Pods: basePods, Namespaces: baseNS, Policies: nil})
	for _, tt := range []struct {
		name string
		d    Decision
	}{
		{"empty", d},
		{"every match", Decision{Pods: []PodRules{
			{Pod: "default/a", IPs: addrs("10.88.0.2", "fd00::2"),
				Ingress: &Rules{Policies: []string{"default/p"}, Allow: []Allow{
					{Peers: Peers{Addrs: addrs("10.88.0.3", "fd00::3")}, Ports: []Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}, {Protocol: "SCTP", Port: 1000, EndPort: 2000}}},
					{Peers: Peers{Blocks: []Block{{CIDR: netip.MustParsePrefix("192.0.2.0/24"), Except: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/26"), netip.MustParsePrefix("192.0.2.64/26")}}}}},
					{Peers: Peers{Blocks: []Block{{CIDR: netip.MustParsePrefix("fd00::/8")}}}, Ports: []Port{{Protocol: "TCP"}}},
				}},
				Egress: &Rules{Policies: []string{"default/q"}}},
		}}},
		{"again", d},
	} {
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script(tt.d))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: nft -f: %v: %s\n%s", tt.name, err, out, script(tt.d))
		}
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	if strings.Contains(string(out), "chain ingress-") {
		t.Errorf("a chain of a pod no longer isolated is left:\n%s", out)
	}
}

// largeCluster is 1,000 pods (110 on this node, the kubelet's default maximum) in 20
// namespaces, each namespace with a deny-all policy and two allowing ones.
func largeCluster() Input {
	in := Input{NodeName: self}
	for n := 0; n < 20; n++ {
		ns := fmt.Sprintf("ns%d", n)
		in.Namespaces = append(in.Namespaces, namespace(ns, map[string]string{"team": fmt.Sprint(n % 4)}))
		in.Policies = append(in.Policies,
			policy(ns, "deny", nil, func(s *networkingv1.NetworkPolicySpec) {
				s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
			}),
			policy(ns, "web", map[string]string{"app": "web"}, ingressOnly(networkingv1.NetworkPolicyIngressRule{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labelSel(map[string]string{"team": "1"}), PodSelector: labelSel(map[string]string{"role": "client"})}},
				Ports: []networkingv1.NetworkPolicyPort{named("http")},
			})),
			policy(ns, "clients", map[string]string{"role": "client"}, egressOnly(networkingv1.NetworkPolicyEgressRule{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: labelSel(map[string]string{"app": "web"})}},
				Ports: []networkingv1.NetworkPolicyPort{named("http")},
			})))
	}
	for i := 0; i < 1000; i++ {
		node := "node-b"
		if i < 110 {
			node = self
		}
		lbl := map[string]string{"role": "client"}
		if i%2 == 0 {
			lbl = map[string]string{"app": "web"}
		}
		in.Pods = append(in.Pods, pod(fmt.Sprintf("ns%d", i%20), fmt.Sprintf("p%d", i), node,
			fmt.Sprintf("10.%d.%d.%d", 88+i/65536, (i/256)%256, i%256+0), lbl, withPort("http", corev1.ProtocolTCP, 8080)))
	}
	return in
}

func BenchmarkDecideAndRender(b *testing.B) {
	in := largeCluster()
	for b.Loop() {
		_ = script(Decide(in))
	}
}

// TestLargeClusterLoads: the rules of a full node in a large cluster load, and how long nft
// takes to swap them in.
func TestLargeClusterLoads(t *testing.T) {
	if os.Geteuid() != 0 || testing.Short() {
		t.Skip("needs root for a network namespace")
	}
	ns := "swnetpol-large"
	_ = exec.Command("ip", "netns", "del", ns).Run()
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	t0 := time.Now()
	s := script(Decide(largeCluster()))
	decided := time.Since(t0)
	for i := 0; i < 3; i++ {
		t1 := time.Now()
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(s)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft -f: %v: %s", err, out)
		}
		t.Logf("decided and rendered in %v (%d lines), written in %v", decided, strings.Count(s, "\n"), time.Since(t1))
	}
}
