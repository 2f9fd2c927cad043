package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// probeImage is the image of test/e2e/svcprobe.
const probeImage = "socialweb.computer/svcprobe:local"

// writeProbeImage builds test/e2e/svcprobe (static) into an image tarball in dir.
func writeProbeImage(t *testing.T, dir string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "svcprobe")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./svcprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build svcprobe: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	files := []node.ImageFile{{Path: "svcprobe", Mode: 0o755, Data: b}}
	if err := node.WriteOCIImage(filepath.Join(dir, "svcprobe.tar"), probeImage, files, nil, []string{"/svcprobe"}, nil); err != nil {
		t.Fatal(err)
	}
}

// probeServer is a pod of Service "probe" (label app: probe) answering on 8080 with its name.
func probeServer(name string) string { return probeServerOf(name, "probe") }

// probeServerOf is probeServer labelled app: app. Its container's fields come last, so a
// caller may append more of them (four spaces in) and then more of the pod's spec (two).
func probeServerOf(name, app string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default, labels: {app: ` + app + `}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + probeImage + `
    imagePullPolicy: Never
    args: [serve, "8080"]
    env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
`
}

var servicesObjects = probeServer("server-0") + "---\n" + probeServer("server-1") + `---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + probeImage + `
    imagePullPolicy: Never
    args: [sleep]
---
apiVersion: v1
kind: Service
metadata: {name: probe, namespace: default}
spec:
  selector: {app: probe}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: probe-np, namespace: default}
spec:
  type: NodePort
  selector: {app: probe}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: probe-headless, namespace: default}
spec:
  clusterIP: None
  selector: {app: probe}
  ports: [{name: http, port: 8080}]
`

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// One node of a tenant cluster serves its pods Services and DNS: a ClusterIP Service by
// address and by name, a NodePort from the bidder host on the node's address, a headless
// Service's name resolving to its pods, and the kubernetes Service answering /api to the
// pod's own token over TLS checked against the projected CA. A forged token is refused
// (401), and the node's address of the apiserver leads only to its own cluster: another
// cluster's apiserver port there is closed, and an EndpointSlice the owner points at that
// port still leads to the owner's own apiserver.
func TestServices_OneNode(t *testing.T) {
	t.Parallel()
	const nodeName = "node-s"
	tc := joinableCluster(t, "svc1", nodeName, 10*time.Minute)
	writeProbeImage(t, tc.images)
	n := readyNode(t, tc, "svc1-a", nodeName, nodeOptions{DNSUpstream: "none", Logs: []string{"log", "kube-proxy.log", "node-dns.log", "kubelet.log"}})
	state, st, dump := n.State, n.Status, n.Dump
	kc := tc.kc

	tkubectl(t, kc, servicesObjects, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "pods Running", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
		return out == "client=Running server-0=Running server-1=Running ", fmt.Errorf("%q\n%s", out, dump())
	})
	podIPs := strings.Fields(tkubectl(t, kc, "", "get", "pods", "-l", "app=probe", "-o", `jsonpath={range .items[*]}{.status.podIP} {end}`))
	sort.Strings(podIPs)
	clusterIP := tkubectl(t, kc, "", "get", "svc", "probe", "-o", "jsonpath={.spec.clusterIP}")
	nodePort := tkubectl(t, kc, "", "get", "svc", "probe-np", "-o", "jsonpath={.spec.ports[0].nodePort}")

	// in runs the probe in the client pod and returns its output (error output included).
	in := func(args ...string) (string, error) {
		out, err := tkubectlErr(kc, append([]string{"exec", "client", "--", "/svcprobe"}, args...)...)
		return strings.TrimSpace(out), err
	}
	eventuallyIn := func(what, want string, args ...string) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, what, func() (bool, error) {
			out, err := in(args...)
			return err == nil && strings.HasPrefix(out, want), fmt.Errorf("%q %v, want %q\n%s", out, err, want, dump())
		})
	}
	servers := map[string]bool{}
	testenv.Eventually(t, 60*time.Second, "the ClusterIP reaches both servers", func() (bool, error) {
		out, err := in("get", "http://"+clusterIP+"/")
		if err == nil && strings.HasPrefix(out, "200 server-") {
			servers[strings.TrimPrefix(out, "200 ")] = true
		}
		return len(servers) == 2, fmt.Errorf("%q %v, seen %v\n%s", out, err, servers, dump())
	})
	eventuallyIn("the Service's name resolves to its ClusterIP", clusterIP, "resolve", "probe")
	eventuallyIn("the Service by name", "200 server-", "get", "http://probe.default.svc.cluster.local/")
	eventuallyIn("the headless Service's name resolves to its pods", strings.Join(podIPs, ","), "resolve", "probe-headless")
	eventuallyIn("kubernetes.default resolves to the first service address", "10.43.0.1", "resolve", "kubernetes.default")
	// With no upstream (this node's operator set none), a name outside the cluster is
	// SERVFAIL ("server misbehaving" to Go's resolver), answered inside the node.
	if out, err := in("resolve", "outside.example."); err == nil || !strings.Contains(err.Error(), "server misbehaving") {
		t.Errorf("a name outside the cluster with no upstream: %q %v, want SERVFAIL (server misbehaving)", out, err)
	}

	// The NodePort, from the bidder host, on the node's address.
	testenv.Eventually(t, 30*time.Second, "the NodePort from the host", func() (bool, error) {
		c := &http.Client{Timeout: 3 * time.Second}
		resp, err := c.Get("http://" + st.Address + ":" + nodePort + "/")
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.HasPrefix(string(b), "server-"), fmt.Errorf("%d %q", resp.StatusCode, b)
	})

	// The kubernetes Service with the pod's own token, TLS checked against the projected CA.
	eventuallyIn("kubernetes.default.svc answers /api to the pod's token", "200 {",
		"get", "https://kubernetes.default.svc/api", saDir+"/ca.crt", saDir+"/token")
	forged := "eyJhbGciOiJSUzI1NiIsImtpZCI6ImZvcmdlZCJ9.eyJpc3MiOiJodHRwczovL2t1YmVybmV0ZXMuZGVmYXVsdC5zdmMiLCJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06ZGVmYXVsdCJ9.Zm9yZ2Vk"
	if out, err := in("get", "https://kubernetes.default.svc/api", saDir+"/ca.crt", forged); err != nil || !strings.HasPrefix(out, "401 ") {
		t.Errorf("a forged token: %q %v, want 401", out, err)
	}

	// Another cluster's apiserver, on the same host: its port on the node's apiserver
	// address is closed; an EndpointSlice of this cluster's owner naming that port leads to
	// this cluster's apiserver (its CA verifies, its pod's token is accepted), never to the
	// other's.
	c := coreClient(t, tc.dir)
	other := &v1alpha1.Cluster{}
	other.Name, other.Namespace = "svc2", "default"
	other.Spec.Account, other.Spec.Name, other.Spec.Running = tenantOwner, "svc2", true
	if err := c.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	other = waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: "svc2"}, v1alpha1.ClusterReady, 90*time.Second)
	otherPort := tkubectl(t, mint(t, tc.dir, other), "", "get", "endpointslice", "-n", "default", "kubernetes", "-o", "jsonpath={.ports[0].port}")
	ownPort := tkubectl(t, kc, "", "get", "endpointslice", "-n", "default", "kubernetes", "-o", "jsonpath={.ports[0].port}")
	if otherPort == "" || otherPort == ownPort {
		t.Fatalf("apiserver ports: own %q, other %q", ownPort, otherPort)
	}
	if out, err := in("get", "https://10.77.0.1:"+otherPort+"/api", saDir+"/ca.crt", saDir+"/token"); err == nil {
		t.Errorf("the other cluster's apiserver port answered a pod: %q", out)
	} else if !strings.Contains(out+err.Error(), "connection refused") {
		t.Errorf("the other cluster's apiserver port: %q %v, want connection refused (the node's own address, nothing listening)", out, err)
	}
	tkubectl(t, kc, `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes-elsewhere
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes}
addressType: IPv4
endpoints: [{addresses: ["10.77.0.1"], conditions: {ready: true}}]
ports: [{name: https, port: `+otherPort+`, protocol: TCP}]
`, "apply", "-f", "-")
	eventuallyIn("the owner's slice naming the other cluster's port leads to this cluster", "200 {",
		"get", "https://10.77.0.1:"+otherPort+"/api", saDir+"/ca.crt", saDir+"/token")

	// What Services and DNS cost a node: the resident memory of its kube-proxy and DNS
	// server.
	for _, word := range []string{"proxy", "node-dns"} {
		for _, pid := range procsWithArg(filepath.Join(state, "svc1-a")) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			args := strings.Split(string(b), "\x00")
			if filepath.Base(args[0]) != filepath.Base(socialwebBin) || !slices.Contains(args, word) {
				continue
			}
			// RssFile is mostly the binary's text, shared with every other process of it.
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			var rss []string
			for _, l := range strings.Split(string(st), "\n") {
				if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "RssAnon:") || strings.HasPrefix(l, "RssFile:") {
					rss = append(rss, strings.Join(strings.Fields(l), " "))
				}
			}
			t.Logf("bench: %s %s", word, strings.Join(rss, ", "))
		}
	}

	// Figures: a Service request (new connection each, by ClusterIP) and a DNS lookup of a
	// Service name (the pod's resolver has no cache), from a pod.
	if out, err := in("bench-get", "http://"+clusterIP+"/", "300"); err != nil {
		t.Errorf("bench-get: %v %s", err, out)
	} else {
		t.Logf("bench: Service request from a pod (ClusterIP, new connection): %s", out)
	}
	if out, err := in("bench-dns", "probe.default.svc.cluster.local.", "300"); err != nil {
		t.Errorf("bench-dns: %v %s", err, out)
	} else {
		t.Logf("bench: DNS lookup of a Service name from a pod: %s", out)
	}
}

// Names outside the cluster are forwarded to the bidder's upstream: a DNS server in a
// namespace standing for the internet (198.51.100.89, reached from the host through a veth
// pair in 198.51.100.52/30). Forwarding needs the nodes' egress through the host; where the
// binary has none (no --node-egress-deny) the row says so and skips, after checking its own
// fixture answers from the host.
func TestServices_DNSForwards(t *testing.T) {
	t.Parallel()
	requireNodeHost(t)
	upstream := internetDNS(t, "probe.example.test.", "192.0.2.80")
	m := new(dns.Msg)
	m.SetQuestion("probe.example.test.", dns.TypeA)
	if r, err := dns.Exchange(m, upstream); err != nil || len(r.Answer) != 1 {
		t.Fatalf("the internet namespace's DNS server from the host: %v %v", r, err)
	}
	help, _ := exec.Command(socialwebBin, "up", "--help").CombinedOutput()
	if !strings.Contains(string(help), "--node-egress-deny") {
		t.Skip("SKIP-NODE-EGRESS: this binary gives nodes no egress through the host (no --node-egress-deny), so no upstream is reachable from a node; " +
			"internal/nodedns TestChooseUpstreams and TestCorefile cover the decision and the configuration")
	}

	tc := joinableCluster(t, "dnsf", "node-f", 10*time.Minute)
	writeProbeImage(t, tc.images)
	dump := readyNode(t, tc, "dnsf-a", "node-f", nodeOptions{DNSUpstream: upstream, Logs: []string{"log", "node-dns.log"}}).Dump
	tkubectl(t, tc.kc, `apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: `+probeImage+`, imagePullPolicy: Never, args: [sleep]}
`, "apply", "-f", "-")
	testenv.Eventually(t, 60*time.Second, "a name outside the cluster resolves through the bidder's upstream", func() (bool, error) {
		out, err := tkubectlErr(tc.kc, "exec", "client", "--", "/svcprobe", "resolve", "probe.example.test.")
		return err == nil && strings.TrimSpace(out) == "192.0.2.80", fmt.Errorf("%q %v\n%s", out, err, dump())
	})
}

// internetDNS makes a network namespace standing for the internet, routed from the host
// through a veth pair, with a DNS server on 198.51.100.89:53 answering name with addr (A)
// and NXDOMAIN to anything else; it returns the server's address.
func internetDNS(t *testing.T, name, addr string) string {
	t.Helper()
	substratetest.HostExclusive(t, "internet-dns") // fixed addresses
	tag := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	netns, link := "swdns-"+tag, "swd"+tag
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", netns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "route", "del", "198.51.100.89/32").Run()
		_ = exec.Command("ip", "link", "del", link).Run()
		_ = exec.Command("ip", "netns", "del", netns).Run()
	})
	run("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", netns)
	run("addr", "add", "198.51.100.53/30", "dev", link)
	run("link", "set", link, "up")
	run("-n", netns, "addr", "add", "198.51.100.54/30", "dev", "eth0")
	run("-n", netns, "link", "set", "eth0", "up")
	run("-n", netns, "link", "set", "lo", "up")
	run("-n", netns, "addr", "add", "198.51.100.89/32", "dev", "lo")
	run("-n", netns, "route", "add", "default", "via", "198.51.100.53")
	run("route", "add", "198.51.100.89/32", "via", "198.51.100.54")

	pc, err := listenUDPInNetns("/run/netns/"+netns, "198.51.100.89:53")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		switch {
		case len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, name):
			m.Rcode = dns.RcodeNameError
		case r.Question[0].Qtype == dns.TypeA:
			rr, _ := dns.NewRR(name + " 30 IN A " + addr)
			m.Answer = append(m.Answer, rr)
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "198.51.100.89:53"
}

// listenUDPInNetns opens a UDP socket inside the network namespace at nsPath
// (substratetest.InNetns).
func listenUDPInNetns(nsPath, addr string) (net.PacketConn, error) {
	var pc net.PacketConn
	var lerr error
	if err := substratetest.InNetns(nsPath, func() { pc, lerr = net.ListenPacket("udp", addr) }); err != nil {
		return nil, err
	}
	return pc, lerr
}
