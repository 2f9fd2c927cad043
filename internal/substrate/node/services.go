package node

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/nodedns"
	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/tenant"
)

// Services and DNS in a node: kube-proxy (`socialweb kube proxy`,
// iptables mode) and the node's DNS server (`socialweb node-dns`, CoreDNS) run inside the
// node's namespaces beside the kubelet, with the node's own credentials. Two addresses are
// the node's own, on its loopback device (this kernel has no dummy interfaces):
// clusternet.NodeLocalDNS, where the DNS server answers (the kubelet's clusterDNS), and
// tenant.AdvertiseIP, the address of the `kubernetes` Service's endpoint: kube-proxy's DNAT
// of 10.43.0.1:443 lands on the node itself, where the agent listens on the endpoint's port
// and forwards to the node's own tenant gate (Join.Server), so TLS runs from the pod to the
// cluster's apiserver and no other cluster's apiserver is reachable on that address.

// servicesPath is a file of the node's services dir: kube-proxy's config, the Corefile,
// their kubeconfig and client certificate.
func (ns nodeState) servicesPath(p string) string { return ns.work("services", p) }

// servicesKubeconfig names the cluster's gate, its CA, and a client certificate file the
// agent keeps current (the kubelet's rotated certificate once it has one): client-go reloads
// certificate files, so kube-proxy and the DNS server follow the kubelet's renewals.
func servicesKubeconfig(ns nodeState) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: cluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: node
  user:
    client-certificate: %s
    client-key: %s
contexts:
- name: node
  context: {cluster: cluster, user: node}
current-context: node
`, ns.Server, ns.secret(SecretCA), ns.servicesPath("client.pem"), ns.servicesPath("client.pem"))
}

// kubeProxyConfig: iptables mode for the plan's pod network; health and metrics on the
// node's own loopback; NodePorts on the node's address only, never on 127.0.0.1 (that would
// make kube-proxy set route_localnet, opening the node's loopback to its pods); no
// conntrack sysctl written (nf_conntrack_max is the host's, and a node's
// /proc/sys is read-only outside net).
func kubeProxyConfig(ns nodeState) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
bindAddress: %s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["%s/32"]
oomScoreAdj: 0
clientConnection:
  kubeconfig: %s
iptables:
  localhostNodePorts: false
  masqueradeAll: false
  minSyncPeriod: 1s
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
`, clusternet.ClusterCIDR, ns.NodeName, ns.NodeIP, ns.NodeIP, ns.servicesPath("kubeconfig"))
}

// remoteGateChain, in the nat table of the node's namespace, sends the node's own
// connections to a control plane on another host to the agent's forward.
const remoteGateChain = "SOCIALWEB-REMOTE-GATE"

// remoteGateRule is the iptables rule (nat table, remoteGateChain) that sends what the node
// itself opens to the control plane's host:port (TCP) to the forward on the node's
// loopback, at the same port. The kubelet, the tunnel and kube-proxy dial the address their
// certificates name and land on the forward; only the node's own connections (OUTPUT), only
// that port: its overlay packets to the same address (UDP, to the endpoints that host
// publishes) and its pods' traffic leave the node as any other.
func remoteGateRule(host, port string) []string {
	return []string{"-d", host + "/32", "-p", "tcp", "--dport", port, "-j", "DNAT", "--to-destination", net.JoinHostPort(LocalGate, port)}
}

// forwardRemoteGate writes remoteGateRule into remoteGateChain (flushed first) and jumps to
// it from the nat table's OUTPUT, once: a restarted agent writes the same rules.
func (ns nodeState) forwardRemoteGate(host, port string) error {
	ipt := func(args ...string) error {
		return ns.runInNet(append([]string{"iptables", "-w", "-t", "nat"}, args...)...)
	}
	c := remoteGateChain
	if err := ipt("-N", c); err != nil && ipt("-S", c) != nil {
		return err
	}
	if err := ipt("-F", c); err != nil {
		return err
	}
	if err := ipt(append([]string{"-A", c}, remoteGateRule(host, port)...)...); err != nil {
		return err
	}
	if ipt("-C", "OUTPUT", "-j", c) == nil {
		return nil
	}
	return ipt("-I", "OUTPUT", "1", "-j", c)
}

// podsToNodeChain filters, in the node's namespace, what pods open to the node itself.
const podsToNodeChain = "SOCIALWEB-PODS-TO-NODE"

// podsToNodeRules are iptables commands (the filter table of the node's namespace) that let
// a pod open connections to its node only for the node's DNS server and the kubernetes
// Service's forwarder: the pods' default route is the node's bridge, and without them a pod
// reaches everything listening on the node's addresses (its kubelet's API, kube-proxy's
// health port on the node address). Replies to what the node opened (the kubelet's probes)
// pass; a Service or NodePort is DNATed before INPUT and forwarded to its pod, untouched.
// Pods of the cluster's other nodes arrive by the overlay (their packets to this node's
// address, for a NodePort, and to the overlay device's own address): the same chain filters
// them, so the overlay opens this node's NodePorts to them and nothing else of the node.
func podsToNodeRules() [][]string {
	c := podsToNodeChain
	return [][]string{
		{"-N", c},
		{"-A", c, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"},
		{"-A", c, "-d", clusternet.NodeLocalDNS + "/32", "-p", "udp", "--dport", "53", "-j", "RETURN"},
		{"-A", c, "-d", clusternet.NodeLocalDNS + "/32", "-p", "tcp", "--dport", "53", "-j", "RETURN"},
		{"-A", c, "-d", tenant.AdvertiseIP.String() + "/32", "-p", "tcp", "-j", "RETURN"},
		{"-A", c, "-j", "DROP"},
		{"-I", "INPUT", "1", "-i", podBridge, "-j", c},
		{"-I", "INPUT", "1", "-i", podnet.InterfaceName, "-j", c},
	}
}

// startServices gives the node its local addresses, starts kube-proxy and the DNS server,
// and the forwarder of the `kubernetes` Service's endpoint.
func (a *agent) startServices() error {
	ns := a.ns
	if err := os.MkdirAll(ns.work("services"), 0o700); err != nil {
		return err
	}
	for _, ip := range []string{clusternet.NodeLocalDNS, tenant.AdvertiseIP.String()} {
		if err := ns.runInNet("ip", "addr", "replace", ip+"/32", "dev", "lo"); err != nil {
			return err
		}
	}
	for _, r := range podsToNodeRules() {
		if err := ns.runInNet(append([]string{"iptables", "-w"}, r...)...); err != nil {
			return err
		}
	}
	if err := a.refreshClientCert(); err != nil {
		return fmt.Errorf("the node's client certificate: %w", err)
	}
	if err := os.WriteFile(ns.servicesPath("kubeconfig"), []byte(servicesKubeconfig(ns)), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(ns.servicesPath("kube-proxy.yaml"), []byte(kubeProxyConfig(ns)), 0o600); err != nil {
		return err
	}
	var err error
	a.proxy, err = a.spawnRestartable("kube-proxy", "kube-proxy.log", ns.Binary, "kube", "proxy", "--config", ns.servicesPath("kube-proxy.yaml"))
	if err != nil {
		return err
	}
	a.logf("kube-proxy started: iptables mode, cluster CIDR %s", clusternet.ClusterCIDR)

	a.logf("DNS upstream: %v (%s)", ns.DNSUpstreams, ns.DNSUpstreamWhy)
	if err := os.WriteFile(ns.servicesPath("Corefile"), []byte(corefileFor(ns)), 0o600); err != nil {
		return err
	}
	a.dns, err = a.spawnRestartable("node-dns", "node-dns.log", ns.Binary, "node-dns", ns.servicesPath("Corefile"))
	if err != nil {
		return err
	}
	a.logf("node-dns started on %s for %s", clusternet.NodeLocalDNS, clusternet.ClusterDomain)

	cfg, err := clientcmd.BuildConfigFromFlags("", ns.servicesPath("kubeconfig"))
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.stopServices = cancel
	a.apiFwd = &apiForwarder{ns: ns, logf: a.logf, lns: map[string]net.Listener{}}
	go a.apiFwd.watch(ctx, cs)
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := a.refreshClientCert(); err != nil {
					a.logf("the node's client certificate: %v", err)
				}
			}
		}
	}()
	return nil
}

// corefileFor is the node's Corefile.
func corefileFor(ns nodeState) string {
	return nodedns.Corefile(nodedns.Config{
		Listen: clusternet.NodeLocalDNS, Domain: clusternet.ClusterDomain,
		Kubeconfig: ns.servicesPath("kubeconfig"), Upstreams: ns.DNSUpstreams,
	})
}

// refreshClientCert writes the node's current client certificate and key to the file the
// services' kubeconfig names, when it changed: the kubelet's rotated pair when it has one
// (kubelet-client-current.pem in its cert dir), else the join bundle's.
func (a *agent) refreshClientCert() error {
	ns := a.ns
	pair, err := a.clientPair()
	if err != nil {
		return err
	}
	if b, _ := pem.Decode(pair); b == nil {
		return fmt.Errorf("no PEM in the node's client certificate")
	}
	p := ns.servicesPath("client.pem")
	if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, pair) {
		return nil
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, pair, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// clientPair is the node's current client certificate and key (one PEM): the kubelet's
// rotated pair when it has one, else the join bundle's.
func (a *agent) clientPair() ([]byte, error) {
	pair, err := os.ReadFile(a.ns.work("kubelet", "pki", "kubelet-client-current.pem"))
	if err == nil {
		return pair, nil
	}
	kc, err := os.ReadFile(a.ns.secret(SecretKubeconfig))
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.Load(kc)
	if err != nil {
		return nil, err
	}
	for _, u := range cfg.AuthInfos {
		if len(u.ClientCertificateData) > 0 && len(u.ClientKeyData) > 0 {
			return append(append([]byte{}, u.ClientCertificateData...), u.ClientKeyData...), nil
		}
	}
	return nil, fmt.Errorf("the join kubeconfig holds no client certificate")
}

// apiForwarder listens, inside the node, on the endpoints of the `kubernetes` Service and
// forwards each connection to the node's tenant gate.
type apiForwarder struct {
	ns   nodeState
	logf func(string, ...any)
	mu   sync.Mutex
	lns  map[string]net.Listener // by address:port
}

// watch follows default/kubernetes's EndpointSlices and keeps the listeners to what
// apiListenAddrs decides, until ctx ends.
func (f *apiForwarder) watch(ctx context.Context, cs kubernetes.Interface) {
	lw := cache.NewFilteredListWatchFromClient(cs.DiscoveryV1().RESTClient(), "endpointslices", metav1.NamespaceDefault,
		func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=kubernetes"
			o.FieldSelector = fields.Everything().String()
		})
	inf := cache.NewSharedIndexInformer(lw, &discoveryv1.EndpointSlice{}, 10*time.Minute, cache.Indexers{})
	sync := func() {
		var slices []*discoveryv1.EndpointSlice
		for _, o := range inf.GetStore().List() {
			slices = append(slices, o.(*discoveryv1.EndpointSlice))
		}
		want, ignored := apiListenAddrs(slices, tenant.AdvertiseIP.String())
		for _, i := range ignored {
			f.logf("kubernetes Service: ignoring endpoint %s (only %s is the cluster's apiserver in a node)", i, tenant.AdvertiseIP)
		}
		f.reconcile(want)
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { sync() },
		UpdateFunc: func(any, any) { sync() },
		DeleteFunc: func(any) { sync() },
	})
	inf.Run(ctx.Done())
	f.reconcile(nil)
}

// reconcile opens listeners for want and closes the others.
func (f *apiForwarder) reconcile(want []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	keep := map[string]bool{}
	for _, addr := range want {
		keep[addr] = true
		if f.lns[addr] != nil {
			continue
		}
		ln, err := f.ns.listen(addr)
		if err != nil {
			f.logf("kubernetes Service: listen on %s: %v", addr, err)
			continue
		}
		f.lns[addr] = ln
		go forwardTo(ln, gateAddr(f.ns))
		f.logf("kubernetes Service: forwarding %s to %s", addr, gateAddr(f.ns))
	}
	for addr, ln := range f.lns {
		if !keep[addr] {
			ln.Close()
			delete(f.lns, addr)
			f.logf("kubernetes Service: stopped %s", addr)
		}
	}
}

// gateAddr is the node's tenant gate on the host (Join.Server's address).
func gateAddr(ns nodeState) string {
	u, err := url.Parse(ns.Server)
	if err != nil {
		return ""
	}
	return u.Host
}

// apiListenAddrs decides where a node listens for the `kubernetes` Service: every port of
// every ready endpoint of the given slices whose address is advertise (the only address a
// node makes its own: an endpoint elsewhere, which the cluster's owner could write into a
// slice, would make the node listen on an address it does not own). Everything it forwards
// goes to the node's own gate, whatever port the slice names, so a port of another
// cluster's apiserver leads to this cluster's. ignored lists the endpoints left out.
func apiListenAddrs(slices []*discoveryv1.EndpointSlice, advertise string) (listen, ignored []string) {
	set, skip := map[string]bool{}, map[string]bool{}
	for _, s := range slices {
		if s == nil || s.Namespace != metav1.NamespaceDefault || s.Labels[discoveryv1.LabelServiceName] != "kubernetes" || s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var ports []int32
		for _, p := range s.Ports {
			if p.Port != nil && *p.Port > 0 && *p.Port < 65536 && (p.Protocol == nil || string(*p.Protocol) == "TCP") {
				ports = append(ports, *p.Port)
			}
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, a := range e.Addresses {
				ip, err := netip.ParseAddr(a)
				for _, p := range ports {
					hp := net.JoinHostPort(a, strconv.Itoa(int(p)))
					if err != nil || ip.String() != advertise {
						skip[hp] = true
						continue
					}
					set[hp] = true
				}
			}
		}
	}
	for k := range set {
		listen = append(listen, k)
	}
	for k := range skip {
		ignored = append(ignored, k)
	}
	sort.Strings(listen)
	sort.Strings(ignored)
	return listen, ignored
}

// stopServicesForwarder ends the endpoint watch and closes its listeners.
func (a *agent) stopServicesForwarder() {
	if a.stopServices != nil {
		a.stopServices()
	}
	if a.apiFwd != nil {
		a.apiFwd.reconcile(nil)
	}
}
