package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// The egress policy of every node a row boots (through up, or a substrate of its own): the
// namespace that stands for the internet and nothing else beyond the cluster.
var (
	testEgressDeny  = []string{"0.0.0.0/0"}
	testEgressAllow = []string{substratetest.InternetCIDR}
)

// httpPod is a spread pod (one per node) serving on :8080 with busybox httpd: / says which
// pod answered, /cgi-bin/ip the address it saw the request come from, /big 64 MiB of zeros.
func httpPod(name string) string {
	script := `mkdir -p /www/cgi-bin && echo "served by $(hostname)" > /www/index.html
printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "$REMOTE_ADDR"\n' > /www/cgi-bin/ip && chmod +x /www/cgi-bin/ip
/bin/busybox dd if=/dev/zero of=/www/big bs=1048576 count=64 2>/dev/null
exec /bin/busybox httpd -f -p 8080 -h /www`
	return strings.Replace(strings.Replace(spreadPod(name), `command: ["/bin/sleep", "3600"]`, `command: ["/bin/sh", "-c", `+strconv.Quote(script)+`]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}`, 1), "terminationGracePeriodSeconds: 1", "terminationGracePeriodSeconds: 1\n  enableServiceLinks: false", 1)
}

// podIP is the pod's IP once it has one.
func podIP(t *testing.T, kc, pod string) string {
	t.Helper()
	var ip string
	testenv.Eventually(t, 30*time.Second, "pod "+pod+" has an IP", func() (bool, error) {
		ip, _ = tkubectlErr(kc, "get", "pod", pod, "-o", "jsonpath={.status.podIP}")
		return ip != "", fmt.Errorf("no IP yet")
	})
	return ip
}

// inPod runs sh -c script in the pod's container.
func inPod(kc, pod, script string) (string, error) {
	return tkubectlErr(kc, "exec", pod, "--", "/bin/sh", "-c", script)
}

// httpGet is a shell command fetching http://addr/path with busybox nc (HTTP/1.0); the
// image's wget resolves through libc and cannot run in it.
func httpGet(addr, path string, timeout int) string {
	host, port, _ := strings.Cut(addr, ":")
	return fmt.Sprintf(`printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' | /bin/busybox nc -w %d %s %s`, path, host, timeout, host, port)
}

// httpBody is the body of an HTTP response, trimmed.
func httpBody(resp string) string {
	resp = strings.ReplaceAll(resp, "\r\n", "\n")
	_, body, _ := strings.Cut(resp, "\n\n")
	return strings.TrimSpace(body)
}

// Two pods of one cluster on two nodes: each node has its own pod CIDR, its overlay key
// and endpoint on its Node, the pods' addresses are distinct and in their nodes' CIDRs (the
// EndpointSlice of a Service over them lists both), a pod reaches the other node's pod by its
// IP, seen there with its own address (no NAT between nodes), through the Service's
// ClusterIP, and through a NodePort on either node's address. The cross-node throughput
// through the overlay is logged.
func TestPodNet_CrossNodePodToPod(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t, "--node-bid-window", "1s")
	kc := n.cluster("pn", "maxNodes: 2, podsPerNode: 1, scaleHold: 30s")
	tkubectl(t, kc, httpPod("a")+"---\n"+httpPod("b")+`---
apiVersion: v1
kind: Service
metadata: {name: spread, namespace: default}
spec:
  selector: {app: spread}
  ports: [{port: 8080}]
`, "apply", "-f", "-")
	nodeA := waitPod(t, kc, "a", "Running", "", 180*time.Second)
	nodeB := waitPod(t, kc, "b", "Running", "", 180*time.Second)
	if nodeA == nodeB {
		t.Fatalf("both pods on %s", nodeA)
	}
	ipA, ipB := podIP(t, kc, "a"), podIP(t, kc, "b")
	cluster := netip.MustParsePrefix(clusternet.ClusterCIDR)
	cidrs := map[string]netip.Prefix{}
	for nodeName, ip := range map[string]string{nodeA: ipA, nodeB: ipB} {
		out := tkubectl(t, kc, "", "get", "node", nodeName, "-o", `jsonpath={.spec.podCIDR} {.metadata.annotations.podnet\.socialweb\.computer/public-key} {.metadata.annotations.podnet\.socialweb\.computer/endpoint}`)
		f := strings.Fields(out)
		if len(f) != 3 {
			t.Fatalf("node %s: podCIDR, key, endpoint = %q", nodeName, out)
		}
		p, err := netip.ParsePrefix(f[0])
		if err != nil || p.Bits() != clusternet.NodeCIDRMaskSize || !cluster.Contains(p.Addr()) {
			t.Errorf("node %s podCIDR %q: want a /%d of %s", nodeName, f[0], clusternet.NodeCIDRMaskSize, cluster)
		}
		if _, err := podnet.ParseKey(f[1]); err != nil {
			t.Errorf("node %s key %q: %v", nodeName, f[1], err)
		}
		if !strings.HasSuffix(f[2], ":"+strconv.Itoa(clusternet.OverlayPort)) {
			t.Errorf("node %s endpoint %q", nodeName, f[2])
		}
		if a, err := netip.ParseAddr(ip); err != nil || !p.Contains(a) {
			t.Errorf("pod on %s has %s, outside its node's %s", nodeName, ip, p)
		}
		cidrs[nodeName] = p
	}
	if cidrs[nodeA] == cidrs[nodeB] {
		t.Errorf("both nodes have pod CIDR %s", cidrs[nodeA])
	}
	testenv.Eventually(t, 30*time.Second, "the EndpointSlice lists both pods", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "endpointslices", "-l", "kubernetes.io/service-name=spread", "-o", "jsonpath={.items[*].endpoints[*].addresses[*]}")
		got := strings.Fields(out)
		return len(got) == 2 && got[0] != got[1] && strings.Contains(out, ipA) && strings.Contains(out, ipB), fmt.Errorf("%q (pods %s, %s)", out, ipA, ipB)
	})

	var got string
	testenv.Eventually(t, 30*time.Second, "pod a reaches pod b across nodes", func() (bool, error) {
		var err error
		got, err = inPod(kc, "a", httpGet(ipB+":8080", "/", 3))
		return httpBody(got) == "served by b", fmt.Errorf("%q %v", got, err)
	})
	seen, err := inPod(kc, "a", httpGet(ipB+":8080", "/cgi-bin/ip", 3))
	seen = strings.TrimSuffix(strings.TrimPrefix(httpBody(seen), "[::ffff:"), "]")
	if err != nil || seen != ipA {
		t.Errorf("pod b saw the request from %q (%v), want pod a's %s: the overlay rewrites no address", seen, err, ipA)
	}
	if back, err := inPod(kc, "b", httpGet(ipA+":8080", "/", 3)); err != nil || httpBody(back) != "served by a" {
		t.Errorf("pod b -> pod a: %q %v", back, err)
	}

	// The Service's ClusterIP from pod a reaches both pods, the one on the other node
	// through kube-proxy's DNAT and the overlay.
	clusterIP := tkubectl(t, kc, "", "get", "service", "spread", "-o", "jsonpath={.spec.clusterIP}")
	served := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, "the Service reaches the pods on both nodes", func() (bool, error) {
		out, err := inPod(kc, "a", httpGet(clusterIP+":8080", "/", 3))
		if b := httpBody(out); strings.HasPrefix(b, "served by ") {
			served[b] = true
		}
		return served["served by a"] && served["served by b"], fmt.Errorf("served so far %v; last %q %v", served, out, err)
	})

	// A NodePort whose only endpoint is pod b, from pod a: at b's node address (through
	// the overlay to b's node, where kube-proxy takes it) and at a's own node address
	// (kube-proxy on a sends it on to b through the overlay). In Kubernetes a pod reaches
	// every node's address.
	tkubectl(t, kc, "", "label", "pod", "b", "only=b")
	tkubectl(t, kc, `apiVersion: v1
kind: Service
metadata: {name: only-b, namespace: default}
spec:
  type: NodePort
  selector: {only: b}
  ports: [{port: 8080}]
`, "apply", "-f", "-")
	nodePort := tkubectl(t, kc, "", "get", "service", "only-b", "-o", "jsonpath={.spec.ports[0].nodePort}")
	for _, nodeName := range []string{nodeB, nodeA} {
		addr := tkubectl(t, kc, "", "get", "node", nodeName, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
		testenv.Eventually(t, 60*time.Second, "pod a reaches the NodePort at node "+nodeName+"'s address "+addr, func() (bool, error) {
			out, err := inPod(kc, "a", httpGet(addr+":"+nodePort, "/", 3))
			return httpBody(out) == "served by b", fmt.Errorf("%q %v", out, err)
		})
	}
	// The overlay opens the other node's NodePorts to pod a, not the rest of that node: its
	// kubelet's API on its address is as closed as on pod a's own node.
	addrB := tkubectl(t, kc, "", "get", "node", nodeB, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`)
	if out, err := inPod(kc, "a", "/bin/busybox nc -w 3 "+addrB+" 10250 </dev/null && echo OPEN"); strings.Contains(out, "OPEN") {
		t.Errorf("pod a opened node %s's kubelet port %s:10250 through the overlay (%v)", nodeB, addrB, err)
	}

	// Throughput: 64 MiB from b to a, three times, timed inside pod a (/proc/uptime, 10 ms).
	var best float64
	for i := 0; i < 3; i++ {
		out, err := inPod(kc, "a", "read t0 x < /proc/uptime; n=$("+httpGet(ipB+":8080", "/big", 30)+" | /bin/busybox wc -c); read t1 x < /proc/uptime; echo $t0 $t1 $n")
		f := strings.Fields(out)
		if err != nil || len(f) != 3 {
			t.Fatalf("64 MiB across nodes: %q %v", out, err)
		}
		t0, _ := strconv.ParseFloat(f[0], 64)
		t1, _ := strconv.ParseFloat(f[1], 64)
		n, _ := strconv.Atoi(f[2])
		if n < 64<<20 || t1 <= t0 {
			t.Fatalf("64 MiB across nodes: %q", out)
		}
		if mibs := float64(n) / (1 << 20) / (t1 - t0); mibs > best {
			best = mibs
		}
	}
	t.Logf("cross-node pod-to-pod throughput through the overlay: %.0f MiB/s (best of 3, 64 MiB over HTTP, timed in the pod)", best)
}

// testNetns is a namespace of the test reached from the host through a veth pair whose
// host end holds hostCIDR's first address and the namespace end its second, with a server
// on every address of the namespace at port 80 and host routes to extra addresses of it.
func testNetns(t *testing.T, prefix, link, hostIP, nsIP string, extra ...string) substratetest.Netns {
	ns := substratetest.NewNetns(t, prefix)
	substratetest.Link(t, substratetest.Netns{}, link, ns, "eth0")
	substratetest.MustIP(t, "addr", "add", hostIP+"/30", "dev", link)
	substratetest.MustIP(t, "link", "set", link, "up")
	ns.IP(t, "addr", "add", nsIP+"/30", "dev", "eth0")
	ns.IP(t, "link", "set", "eth0", "up")
	ns.IP(t, "route", "add", "default", "via", hostIP)
	for _, a := range extra {
		ns.IP(t, "addr", "add", a+"/32", "dev", "lo")
		substratetest.MustIP(t, "route", "replace", a+"/32", "via", nsIP, "dev", link)
	}
	ns.In(t, func() {
		ln, err := net.Listen("tcp", "0.0.0.0:80")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	})
	return ns
}

// hostListener listens on addr (an address of the host) for the test's length.
func hostListener(t *testing.T, addr string) string {
	a, _ := countingListener(t, addr)
	return a
}

// countingListener listens on addr for the test's length and counts the connections it
// accepts (and closes at once).
func countingListener(t *testing.T, addr string) (string, *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	hits := &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			hits.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), hits
}

// A pod's egress: an HTTP server in the namespace that stands for the internet answers it;
// the host's loopback and its other addresses (the node link's host end, the tenant
// network's 10.77.0.1, the internet link's host end), a private address and the metadata
// address (169.254.169.254) served in a namespace of the test, and another node's address
// on a node link all stay out of reach. The pod's own loopback listener is the control.
func TestSecurity_PodEgress(t *testing.T) {
	t.Parallel()
	inet := substratetest.NewInternet(t)
	// A private network of the provider, with a metadata service on it.
	testNetns(t, "swpriv", "swp"+strconv.Itoa(int(time.Now().UnixNano()%1e6)), "172.31.213.1", "172.31.213.2", "169.254.169.254")
	// Another cluster's node: a namespace on a node link, its kubelet port served.
	testNetns(t, "swother", "swnfeedc0ffee", "10.78.250.1", "10.78.250.2")

	n := startNodeUp(t, "--node-bid-window", "1s")
	kc := n.cluster("eg", "maxNodes: 1, scaleHold: 30s")
	tkubectl(t, kc, spreadPod("first"), "apply", "-f", "-")
	nodeA := waitPod(t, kc, "first", "Running", "", 180*time.Second)
	var nsA struct {
		HostIP   string `json:"hostIP"`
		HostLink string `json:"hostLink"`
	}
	if err := guestproc.ReadJSON(filepath.Join(n.guestOf(nodeA), "node.json"), &nsA); err != nil {
		t.Fatal(err)
	}
	core := n.up.phase(t, "core serving at ")
	targets := []string{
		"127.0.0.1:" + strconv.Itoa(portOf(t, core)),       // the pod's own loopback: the host's is not in view
		hostListener(t, nsA.HostIP+":0"),                   // the node link's host end
		hostListener(t, "10.77.0.1:0"),                     // the tenant network's host end
		hostListener(t, substratetest.InternetHostIP+":0"), // the host's address towards the internet
		"172.31.213.2:80", "169.254.169.254:80",            // private and metadata, in a namespace of the test
		"10.78.250.2:80", // another cluster's node
	}
	control := inet.HTTP
	tkubectl(t, kc, strings.Replace(proberPod("prober", targets), "spec:\n", "spec:\n  nodeName: "+nodeA+"\n", 1), "apply", "-f", "-")
	waitPod(t, kc, "prober", "Running", nodeA, 60*time.Second)
	var logs string
	testenv.Eventually(t, 60*time.Second, "prober done", func() (bool, error) {
		logs, _ = tkubectlErr(kc, "logs", "prober")
		return strings.Contains(logs, "probes done"), fmt.Errorf("%q", logs)
	})
	checkProbes(t, logs, "127.0.0.1:7777", targets)

	// The internet: a real HTTP request from the pod, answered.
	body, err := inPod(kc, "prober", httpGet(control, "/", 5))
	if err != nil || httpBody(body) != inet.Body {
		t.Errorf("pod -> the internet namespace %s: %q %v", control, body, err)
	}
	jump := "-A " + podnet.ChainEgress + " " + strings.Join(podnet.EgressJump(nsA.HostLink), " ")
	if out, err := exec.Command("iptables", "-w", "-S", podnet.ChainEgress).CombinedOutput(); err != nil || !strings.Contains(string(out), jump) {
		t.Errorf("the node's jump %q is not in %s: %s %v", jump, podnet.ChainEgress, out, err)
	}
}

// TestPodNet_NodesPublishEndpointsOnTheHostsAddress: with --node-overlay-address (this
// host's address as other hosts would reach it: here a documentation address on the host's
// end of a veth pair into a namespace of the test's), each node publishes an endpoint of that address and a port of
// --node-overlay-ports, the host forwards it to the node, and two nodes' pods reach each
// other through those endpoints. Once the nodes are gone, the host forwards nothing more.
func TestPodNet_NodesPublishEndpointsOnTheHostsAddress(t *testing.T) {
	t.Parallel()
	requireNodeHost(t)
	const public = "198.51.100.200"
	publicAddressOnVeth(t, "swtpub", public)
	n := startNodeUp(t, "--node-bid-window", "1s", "--node-overlay-address", public, "--node-overlay-ports", "51900-51909")
	kc := n.cluster("pub", "maxNodes: 2, podsPerNode: 1, scaleHold: 30s")
	tkubectl(t, kc, httpPod("a")+"---\n"+httpPod("b"), "apply", "-f", "-")
	nodeA := waitPod(t, kc, "a", "Running", "", 180*time.Second)
	nodeB := waitPod(t, kc, "b", "Running", "", 180*time.Second)
	if nodeA == nodeB {
		t.Fatalf("both pods on %s", nodeA)
	}
	seen := map[string]bool{}
	for _, nodeName := range []string{nodeA, nodeB} {
		ep := tkubectl(t, kc, "", "get", "node", nodeName, "-o", `jsonpath={.metadata.annotations.podnet\.socialweb\.computer/endpoint}`)
		ap, err := netip.ParseAddrPort(strings.TrimSpace(ep))
		if err != nil || ap.Addr().String() != public || ap.Port() < 51900 || ap.Port() > 51909 || seen[ep] {
			t.Fatalf("node %s publishes endpoint %q: want %s and a port of its own in 51900-51909", nodeName, ep, public)
		}
		seen[ep] = true
	}
	nat, err := exec.Command("iptables", "-w", "-t", "nat", "-S", podnet.ChainOverlayIn).CombinedOutput()
	if err != nil || strings.Count(string(nat), "-j SWNO-") < 2 {
		t.Fatalf("the host forwards no endpoint of the two nodes: %v\n%s", err, nat)
	}
	ipA, ipB := podIP(t, kc, "a"), podIP(t, kc, "b")
	testenv.Eventually(t, 60*time.Second, "pod a reaches pod b through the published endpoints", func() (bool, error) {
		got, err := inPod(kc, "a", httpGet(ipB+":8080", "/", 3))
		return httpBody(got) == "served by b", fmt.Errorf("%q %v", got, err)
	})
	if back, err := inPod(kc, "b", httpGet(ipA+":8080", "/", 3)); err != nil || httpBody(back) != "served by a" {
		t.Errorf("pod b -> pod a: %q %v", back, err)
	}

	tkubectl(t, kc, "", "delete", "pod", "a", "b", "--wait=false")
	n.up.kubectl(t, "", "delete", "cluster", "pub", "--wait=false")
	testenv.Eventually(t, 120*time.Second, "the host forwards no endpoint once the nodes are gone", func() (bool, error) {
		out, _ := exec.Command("iptables", "-w", "-t", "nat", "-S").CombinedOutput()
		var left []string
		for _, l := range strings.Split(string(out), "\n") {
			for ep := range seen {
				if strings.Contains(l, "--dport "+ep[strings.LastIndexByte(ep, ':')+1:]+" ") && strings.Contains(l, public) {
					left = append(left, l)
				}
			}
		}
		return len(left) == 0, fmt.Errorf("still forwarded: %q", left)
	})
}

// publicAddressOnVeth puts public (a /32) on the host's end of a veth pair into a namespace
// of the test's own: an address of this host as other hosts would reach it, from a
// documentation range nothing outside the machine holds. Both go when the test ends.
func publicAddressOnVeth(t *testing.T, prefix, public string) {
	t.Helper()
	substratetest.HostExclusive(t, "address-"+public)
	link := fmt.Sprintf("%s%d", prefix, time.Now().UnixNano()%100000)
	far := substratetest.NewNetns(t, prefix)
	substratetest.Link(t, substratetest.Netns{}, link, far, "eth0")
	far.IP(t, "link", "set", "eth0", "up")
	substratetest.MustIP(t, "addr", "add", public+"/32", "dev", link)
	substratetest.MustIP(t, "link", "set", link, "up")
}

// TestNode_JoinsAtTheTenantAddress: with --tenant-address (this host's public address, here a
// documentation address on the host's end of a veth pair), a cluster's gate listens there
// too, on its status.server's port, the node contract's join names it, and up's own node
// bidder takes it as its local gate: the node joins through it (its kubelet's connections
// and its tunnel go to that address, with the serving certificate naming it), runs a pod
// whose log the apiserver fetches back through the tunnel.
func TestNode_JoinsAtTheTenantAddress(t *testing.T) {
	t.Parallel()
	requireNodeHost(t)
	const public = "198.51.100.201"
	publicAddressOnVeth(t, "swttad", public)
	n := startNodeUp(t, "--node-bid-window", "1s", "--tenant-address", public)
	kc := n.cluster("ta", "maxNodes: 1, scaleHold: 30s")

	var cl v1alpha1.Cluster
	if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "ta"}, &cl); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(cl.Status.Server)
	if err != nil {
		t.Fatal(err)
	}
	gate := net.JoinHostPort(public, u.Port())
	if c, err := net.DialTimeout("tcp", gate, 5*time.Second); err != nil {
		t.Fatalf("the gate of %s does not listen on %s: %v", cl.Status.Server, gate, err)
	} else {
		c.Close()
	}

	tkubectl(t, kc, httpPod("a"), "apply", "-f", "-")
	nodeName := waitPod(t, kc, "a", "Running", "", 180*time.Second)
	var claim v1alpha1.NodeClaim
	for _, c := range n.claims("ta") {
		if c.Spec.NodeName == nodeName {
			claim = c
		}
	}
	cc, _ := n.contractOf(claim)
	if cc.Spec.NodeJoin == nil || cc.Spec.NodeJoin.Server != "https://"+gate {
		t.Errorf("the node contract's join: %+v, want its server https://%s", cc.Spec.NodeJoin, gate)
	}
	if out, err := tkubectlErr(kc, "logs", "a"); err != nil {
		t.Errorf("the apiserver fetches no log through the node's tunnel at %s: %q %v", gate, out, err)
	}
}
