package netpol

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"socialweb.computer/internal/netns"
)

// kernelNode is a node's network in miniature: a namespace with a bridge (the node) and a
// namespace per pod on a veth into it, the layout the CNI bridge plugin makes.
type kernelNode struct {
	t    *testing.T
	node string
	pods map[string]string // pod name -> its namespace
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newKernelNode(t *testing.T, pods map[string]string) *kernelNode {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	for _, bin := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s", bin)
		}
	}
	tag := fmt.Sprintf("swnp%d", os.Getpid()%100000)
	k := &kernelNode{t: t, node: tag + "n", pods: map[string]string{}}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", k.node).Run()
		for _, ns := range k.pods {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	run(t, "ip", "netns", "add", k.node)
	run(t, "ip", "-n", k.node, "link", "set", "lo", "up")
	run(t, "ip", "-n", k.node, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", k.node, "addr", "add", "10.99.0.1/24", "dev", "br0")
	run(t, "ip", "-n", k.node, "link", "set", "br0", "up")
	b, err := exec.Command("ip", "netns", "exec", k.node, "sysctl", "-n", "net.bridge.bridge-nf-call-iptables").Output()
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Skipf("bridged traffic does not go through netfilter here (br_netfilter): %q %v", b, err)
	}
	i := 0
	for name, ip := range pods {
		i++
		ns := fmt.Sprintf("%sp%d", tag, i)
		k.pods[name] = ns
		run(t, "ip", "netns", "add", ns)
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		run(t, "ip", "-n", k.node, "link", "add", fmt.Sprintf("veth%d", i), "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "-n", k.node, "link", "set", fmt.Sprintf("veth%d", i), "master", "br0", "up")
		run(t, "ip", "-n", ns, "addr", "add", ip+"/24", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "route", "add", "default", "via", "10.99.0.1")
		// A web server answering "<name>-ok" on 8080.
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(name+"-ok\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		srv := exec.Command("ip", "netns", "exec", ns, "/bin/busybox", "httpd", "-f", "-p", "8080", "-h", dir)
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	}
	return k
}

// apply writes d's rules into the node's namespace as the process does: one nft transaction.
func (k *kernelNode) apply(d Decision) {
	k.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", k.node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script(d))
	if out, err := cmd.CombinedOutput(); err != nil {
		k.t.Fatalf("nft -f: %v: %s", err, out)
	}
}

// reaches says whether a GET from the namespace of from ("node" for the node itself) to the
// web server of pod to succeeds, with a fresh connection.
func (k *kernelNode) reaches(from, to, toIP string) bool {
	ns := k.node
	if from != "node" {
		ns = k.pods[from]
	}
	out, err := exec.Command("ip", "netns", "exec", ns, "/bin/busybox", "timeout", "2",
		"/bin/busybox", "wget", "-qO-", "http://"+toIP+":8080/").Output()
	return err == nil && strings.Contains(string(out), to+"-ok")
}

// TestRulesInTheKernel: the rules Decide and fill make, loaded into a real bridge's node
// namespace, let through what the policies allow and nothing else, and never the node's own
// traffic to its pods.
func TestRulesInTheKernel(t *testing.T) {
	ips := map[string]string{"web": "10.99.0.2", "client": "10.99.0.3", "stranger": "10.99.0.4"}
	k := newKernelNode(t, ips)
	pods := []*corev1.Pod{
		pod("default", "web", self, ips["web"], map[string]string{"app": "web"}, withPort("http", corev1.ProtocolTCP, 8080)),
		pod("default", "client", self, ips["client"], map[string]string{"role": "client"}),
		pod("default", "stranger", self, ips["stranger"], nil),
	}
	webIngress := policy("default", "web-ingress", map[string]string{"app": "web"}, ingressOnly(networkingv1.NetworkPolicyIngressRule{
		From:  []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel(map[string]string{"role": "client"})}},
		Ports: []networkingv1.NetworkPolicyPort{named("http")},
	}))
	clientEgress := policy("default", "client-egress", map[string]string{"role": "client"}, egressOnly(networkingv1.NetworkPolicyEgressRule{
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel(map[string]string{"app": "web"})}},
		Ports: []networkingv1.NetworkPolicyPort{tcp(8080)},
	}))
	webNoEgress := policy("default", "web-no-egress", map[string]string{"app": "web"}, egressOnly())
	// The servers take a moment to listen.
	deadline := time.Now().Add(5 * time.Second)
	for !k.reaches("node", "web", ips["web"]) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	type want struct {
		from, to string
		ok       bool
	}
	for _, step := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		want     []want
	}{
		{"no policy", nil, []want{
			{"client", "web", true}, {"stranger", "web", true}, {"client", "stranger", true}, {"node", "web", true},
		}},
		{"web takes only clients on its port named http", []*networkingv1.NetworkPolicy{webIngress}, []want{
			{"client", "web", true}, {"stranger", "web", false}, {"node", "web", true}, {"web", "stranger", true},
		}},
		{"and the client sends only to web", []*networkingv1.NetworkPolicy{webIngress, clientEgress}, []want{
			{"client", "web", true}, {"client", "stranger", false}, {"stranger", "client", true}, {"stranger", "web", false}, {"node", "client", true},
		}},
		{"web sends nothing of its own: its answers to clients still pass", []*networkingv1.NetworkPolicy{webIngress, webNoEgress}, []want{
			{"client", "web", true}, {"web", "stranger", false}, {"web", "client", false}, {"stranger", "web", false},
		}},
		{"policies gone", nil, []want{
			{"client", "stranger", true}, {"stranger", "web", true},
		}},
	} {
		k.apply(Decide(Input{NodeName: self, Pods: pods, Namespaces: baseNS, Policies: step.policies}))
		for _, w := range step.want {
			if got := k.reaches(w.from, w.to, ips[w.to]); got != w.ok {
				out, _ := exec.Command("ip", "netns", "exec", k.node, "nft", "list", "table", "inet", TableName).CombinedOutput()
				t.Errorf("%s: %s reaches %s: %v, want %v\n%s", step.name, w.from, w.to, got, w.ok, out)
			}
		}
	}
}

// TestRulesEndConnectionsTheyRefuse: a connection opened before any policy does not outlive
// the policy that refuses it (its next packet from the initiator is dropped), while one the
// policy allows goes on, its replies included.
func TestRulesEndConnectionsTheyRefuse(t *testing.T) {
	ips := map[string]string{"web": "10.99.0.2", "client": "10.99.0.3", "stranger": "10.99.0.4"}
	k := newKernelNode(t, ips)
	pods := []*corev1.Pod{
		pod("default", "web", self, ips["web"], map[string]string{"app": "web"}),
		pod("default", "client", self, ips["client"], map[string]string{"role": "client"}),
		pod("default", "stranger", self, ips["stranger"], nil),
	}
	// The table as a node has it before any policy: conntrack follows every connection
	// from here on (a namespace without a ct rule tracks none).
	k.apply(Decide(Input{NodeName: self, Pods: pods, Namespaces: baseNS}))
	// An echo server in web's namespace, and one open connection to it from each of the
	// others, each answered once before any policy.
	var ln net.Listener
	if err := netns.Do("/run/netns/"+k.pods["web"], func() (err error) {
		ln, err = net.Listen("tcp", ips["web"]+":9090")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	conns := map[string]net.Conn{}
	for _, from := range []string{"client", "stranger"} {
		var c net.Conn
		if err := netns.Do("/run/netns/"+k.pods[from], func() (err error) {
			c, err = net.DialTimeout("tcp", ips["web"]+":9090", 5*time.Second)
			return err
		}); err != nil {
			t.Fatalf("%s dials web: %v", from, err)
		}
		t.Cleanup(func() { c.Close() })
		conns[from] = c
	}
	echoes := func(from, msg string) bool {
		c := conns[from]
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return false
		}
		buf := make([]byte, len(msg))
		_, err := io.ReadFull(c, buf)
		return err == nil && string(buf) == msg
	}
	for _, from := range []string{"client", "stranger"} {
		if !echoes(from, "before;") {
			t.Fatalf("%s's connection did not echo before any policy", from)
		}
	}

	webIngress := policy("default", "web-ingress", map[string]string{"app": "web"}, ingressOnly(networkingv1.NetworkPolicyIngressRule{
		From: []networkingv1.NetworkPolicyPeer{{PodSelector: labelSel(map[string]string{"role": "client"})}},
	}))
	k.apply(Decide(Input{NodeName: self, Pods: pods, Namespaces: baseNS, Policies: []*networkingv1.NetworkPolicy{webIngress}}))
	if !echoes("client", "after;") {
		t.Error("the client's connection, which the policy allows, stopped")
	}
	if echoes("stranger", "after;") {
		out, _ := exec.Command("ip", "netns", "exec", k.node, "nft", "list", "table", "inet", TableName).CombinedOutput()
		t.Errorf("the stranger's connection, opened before the policy that refuses it, still echoes\n%s", out)
	}
}
