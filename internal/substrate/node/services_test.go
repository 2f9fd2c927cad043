package node

import (
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestAPIListenAddrs(t *testing.T) {
	port := func(p int32) discoveryv1.EndpointPort { return discoveryv1.EndpointPort{Port: &p} }
	udp := corev1.ProtocolUDP
	no := false
	slice := func(ns, svc string, at discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: at, Ports: ports, Endpoints: eps,
		}
	}
	ep := func(addrs ...string) discoveryv1.Endpoint { return discoveryv1.Endpoint{Addresses: addrs} }
	const adv = "10.77.0.1"

	for _, tc := range []struct {
		name            string
		slices          []*discoveryv1.EndpointSlice
		listen, ignored []string
	}{
		{name: "the apiserver's own slice",
			slices: []*discoveryv1.EndpointSlice{slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443)}, ep(adv))},
			listen: []string{"10.77.0.1:6443"}},
		{name: "an address other than the advertise address is never listened on",
			slices: []*discoveryv1.EndpointSlice{slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443)}, ep(adv, "10.78.0.2", "169.254.20.10"))},
			listen: []string{"10.77.0.1:6443"}, ignored: []string{"10.78.0.2:6443", "169.254.20.10:6443"}},
		{name: "several slices and ports, deduplicated and sorted",
			slices: []*discoveryv1.EndpointSlice{
				slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(7000), port(6443)}, ep(adv)),
				slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443)}, ep(adv)),
			},
			listen: []string{"10.77.0.1:6443", "10.77.0.1:7000"}},
		{name: "another namespace's or Service's slice is not the kubernetes Service",
			slices: []*discoveryv1.EndpointSlice{
				slice("kube-system", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443)}, ep(adv)),
				slice("default", "web", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(80)}, ep(adv)),
			}},
		{name: "not ready, UDP, bad ports and other families are left out",
			slices: []*discoveryv1.EndpointSlice{
				slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{port(6443)}, discoveryv1.Endpoint{Addresses: []string{adv}, Conditions: discoveryv1.EndpointConditions{Ready: &no}}),
				slice("default", "kubernetes", discoveryv1.AddressTypeIPv4, []discoveryv1.EndpointPort{{Port: ptr(int32(53)), Protocol: &udp}, port(0), port(70000)}, ep(adv)),
				slice("default", "kubernetes", discoveryv1.AddressTypeIPv6, []discoveryv1.EndpointPort{port(6443)}, ep("fd00::1")),
				nil,
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen, ignored := apiListenAddrs(tc.slices, adv)
			if !reflect.DeepEqual(listen, tc.listen) || !reflect.DeepEqual(ignored, tc.ignored) {
				t.Errorf("listen %v ignored %v, want %v %v", listen, ignored, tc.listen, tc.ignored)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestKubeProxyConfigKeepsToTheNode(t *testing.T) {
	ns := nodeState{NodeName: "n1", NodeIP: "10.78.0.2", Dir: "/d"}
	c := kubeProxyConfig(ns)
	for _, want := range []string{
		"mode: iptables\n", "clusterCIDR: 10.42.0.0/16\n", "hostnameOverride: n1\n",
		"healthzBindAddress: 127.0.0.1:", "metricsBindAddress: 127.0.0.1:",
		// NodePorts on the node's address only: a loopback NodePort makes kube-proxy set
		// route_localnet, which opens the node's loopback to its pods.
		`nodePortAddresses: ["10.78.0.2/32"]`, "localhostNodePorts: false\n",
		// No conntrack sysctl: nf_conntrack_max is the host's.
		"maxPerCore: 0\n", "min: 0\n", "tcpEstablishedTimeout: 0s\n", "tcpCloseWaitTimeout: 0s\n",
	} {
		if !strings.Contains(c, want) {
			t.Errorf("kube-proxy config lacks %q:\n%s", want, c)
		}
	}
}
