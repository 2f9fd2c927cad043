package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// Addresses of the remote join row: the control plane's host has remoteGate on its link to
// the internet namespace; the bidder's host is a namespace whose only link goes to the
// internet namespace. Both links are /30s of a documentation range no other row uses
// (192.0.2.0/24 is this machine's own LAN, so not that one).
const (
	remoteGate     = "198.51.100.205"
	remoteInetSide = "198.51.100.206" // the internet's end of the control plane host's link
	remoteBidRoute = "198.51.100.213" // the internet's end of the bidder host's link
	remoteBidHost  = "198.51.100.214"
	remoteBidNet   = "198.51.100.212/30"
	nearNodeName   = "near-node" // the node on the control plane's host
)

// remoteBidderEnv carries a remoteBidderSpec to the helper process.
const remoteBidderEnv = "SOCIALWEB_E2E_REMOTE_BIDDER"

// remoteBidderSpec is what the helper process boots: a node of the namespace flavour, with
// its own state dir, joining with the bundle.
type remoteBidderSpec struct {
	State, Images, NodeName, Server string
	Kubeconfig, CA                  []byte
}

// TestNode_JoinsFromAnotherHost: a node bidder on a host of its own (a network namespace
// whose only link goes to a namespace standing for the internet) boots a node into a
// cluster whose control plane runs here with --tenant-address: the node dials the public
// address through the internet namespace and registers. A pod on it reaches a web pod on a
// node of this host by its pod IP and through its Service's name, over the two nodes'
// overlay (each publishing its endpoint on its host's address), and the apiserver reaches
// the far pod through the far node's tunnel (exec). Nothing else connects the two hosts.
func TestNode_JoinsFromAnotherHost(t *testing.T) {
	t.Parallel()
	requireNodeHost(t)
	_, bid := newRemoteHosts(t)

	const nodeName = "far-node"
	tc := joinableClusterArgs(t, "rj", []string{"--tenant-address", remoteGate})
	writeProbeImage(t, tc.images)
	u, err := url.Parse(tc.cl.Status.Server)
	if err != nil {
		t.Fatal(err)
	}
	server := "https://" + remoteGate + ":" + u.Port()
	bundle, err := tenant.MintNodeBundle(filepath.Join(tc.dir, "tenants"), tenant.Key{Namespace: tc.cl.Namespace, Name: tc.cl.Name}, nodeName, server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "nodes")
	spec, _ := json.Marshal(remoteBidderSpec{State: state, Images: tc.images, NodeName: nodeName,
		Server: server, Kubeconfig: bundle.Kubeconfig, CA: bundle.CAPEM})

	// The bidder host: this test binary again, in the bidder namespace (its network only:
	// the node substrate needs the host's cgroups and /run).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := startOnHost(t, bid.Path(), "the bidder host", 90*time.Second,
		[]string{remoteBidderEnv + "=" + string(spec), "SOCIALWEB_TEST_BIN=" + socialwebBin},
		self, "-test.run", "^TestHelperRemoteBidder$", "-test.v", "-test.timeout", "20m")
	// The bidder host's output, then the tails of its node's logs (its state dir is this
	// test's).
	dump := func() string {
		b, _ := os.ReadFile(host.log)
		out := string(b)
		for _, f := range []string{"log", "kubelet.log"} {
			tail, _ := guestproc.Tail(filepath.Join(state, "far", f), 30)
			out += "--- " + f + "\n" + string(tail) + "\n"
		}
		return out
	}

	testenv.Eventually(t, 3*time.Minute, "the far node Ready", func() (bool, error) {
		out, err := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", fmt.Errorf("%q %v\n%s", out, err, dump())
	})
	// A node on the control plane's host, its overlay endpoint published on that host's
	// address; its pods are what the far node's pods reach across the internet namespace.
	near := nearNode(t, tc)
	tkubectl(t, tc.kc, onNode(t, webObjects(), "web", nearNodeName)+onNode(t, vmProbePod("far", "{}"), "far", nodeName), "apply", "-f", "-")
	waitPod(t, tc.kc, "web", "Running", nearNodeName, 2*time.Minute)
	waitPod(t, tc.kc, "far", "Running", nodeName, 2*time.Minute)
	webIP := podIP(t, tc.kc, "web")
	for _, url := range []string{"http://" + webIP + ":8080/", "http://web.default.svc.cluster.local/"} {
		testenv.Eventually(t, 60*time.Second, "the far pod reaches "+url+" on the near node", func() (bool, error) {
			out, err := tkubectlErr(tc.kc, "exec", "far", "--", "/svcprobe", "get", url)
			out = strings.TrimSpace(out)
			return err == nil && out == "200 web-ok", fmt.Errorf("%q %v\n%s\n--- near node\n%s", out, err, dump(), near.Dump())
		})
	}
	host.stop()
}

// hostProc is a process on another host of the remote rows: run in that host's network
// namespace only (nsenter --net; `ip netns exec` would mount a sysfs of its own, and a node
// substrate needs the host's cgroups), its output in a log.
type hostProc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	log     string
	timeout time.Duration
	stopped bool
}

// startOnHost starts argv (with env added) in the network namespace at netnsPath. It is
// stopped at cleanup, if the test did not stop it, and its log's tail is printed when the
// test failed.
func startOnHost(t *testing.T, netnsPath, name string, timeout time.Duration, env []string, argv ...string) *hostProc {
	t.Helper()
	p := &hostProc{t: t, name: name, log: filepath.Join(t.TempDir(), "host.log"), timeout: timeout}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command("nsenter", append([]string{"--net=" + netnsPath, "--"}, argv...)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	err = p.cmd.Start()
	logf.Close() // the process has its own copy
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, p.tail())
		}
	})
	return p
}

// stop ends the process once: SIGTERM, SIGKILL after its timeout. Exiting with an error or
// not in time fails the test.
func (p *hostProc) stop() {
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("%s: %v\n%s", p.name, err, p.tail())
		}
	case <-time.After(p.timeout):
		_ = p.cmd.Process.Kill()
		p.t.Errorf("%s did not stop within %s", p.name, p.timeout)
	}
}

// tail is the last 30000 bytes of the process's log.
func (p *hostProc) tail() []byte {
	b, _ := os.ReadFile(p.log)
	if len(b) > 30000 {
		b = b[len(b)-30000:]
	}
	return b
}

// newRemoteHosts makes the two hosts of the remote rows: a namespace standing for the
// internet, linked to this host (remoteGate here, remoteInetSide there) and to a namespace
// that is the bidder's host (remoteBidHost, its default route through the internet). It
// holds HostExclusive "remote-join" (the addresses are fixed) until the test ends.
func newRemoteHosts(t *testing.T) (inet, bid substratetest.Netns) {
	t.Helper()
	substratetest.HostExclusive(t, "remote-join") // the addresses above
	inet = substratetest.NewNetns(t, "swtinet")
	bid = substratetest.NewNetns(t, "swtbid")
	hostLink := "swtrj" + inet.Name[len("swtinet-"):]
	substratetest.Link(t, substratetest.Netns{}, hostLink, inet, "eth0")
	substratetest.MustIP(t, "addr", "add", remoteGate+"/30", "dev", hostLink)
	substratetest.MustIP(t, "link", "set", hostLink, "up")
	substratetest.MustIP(t, "route", "replace", remoteBidNet, "via", remoteInetSide, "dev", hostLink)
	t.Cleanup(func() { _ = exec.Command("ip", "route", "del", remoteBidNet).Run() })
	inet.IP(t, "addr", "add", remoteInetSide+"/30", "dev", "eth0")
	inet.IP(t, "link", "set", "eth0", "up")
	substratetest.Link(t, inet, "eth1", bid, "eth0")
	inet.IP(t, "addr", "add", remoteBidRoute+"/30", "dev", "eth1")
	inet.IP(t, "link", "set", "eth1", "up")
	bid.IP(t, "addr", "add", remoteBidHost+"/30", "dev", "eth0")
	bid.IP(t, "link", "set", "eth0", "up")
	bid.IP(t, "link", "set", "lo", "up")
	bid.IP(t, "route", "add", "default", "via", remoteBidRoute)
	if out, err := exec.Command("ip", "netns", "exec", inet.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding in the internet namespace: %v %s", err, out)
	}
	return inet, bid
}

// webObjects are vmNetworkObjects' web server and its Service, without the probe pods.
func webObjects() string {
	web, _, _ := strings.Cut(vmNetworkObjects, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: client")
	return web
}

// onNode binds pod in objects (YAML) to nodeName.
func onNode(t *testing.T, objects, pod, nodeName string) string {
	t.Helper()
	at := regexp.MustCompile(`(?m)^metadata: \{name: ` + regexp.QuoteMeta(pod) + `,.*\n^spec:\n`)
	loc := at.FindStringIndex(objects)
	if loc == nil {
		t.Fatalf("no pod %s in\n%s", pod, objects)
	}
	return objects[:loc[1]] + "  nodeName: " + nodeName + "\n" + objects[loc[1]:]
}

// nearNode boots a node of tc's cluster on this host (joining at 127.0.0.1) whose overlay
// endpoint is published on remoteGate, whose pods may reach the bidder host's link (the
// test policy denies everything else), and waits for it Ready.
func nearNode(t *testing.T, tc tenantToJoin) readiedNode {
	t.Helper()
	bundle, err := tenant.MintNodeBundle(filepath.Join(tc.dir, "tenants"), tenant.Key{Namespace: tc.cl.Namespace, Name: tc.cl.Name}, nearNodeName, tc.cl.Status.Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tc.bundle = bundle
	return readyNode(t, tc, "near", nearNodeName, nodeOptions{DNSUpstream: "none",
		OverlayAddress: remoteGate, OverlayPorts: "51910-51919", EgressAllow: []string{remoteBidNet}})
}

// TestHelperRemoteBidder is the bidder host of TestNode_JoinsFromAnotherHost, run in its
// namespace: it boots the node it is given, and stops and removes it on SIGTERM.
func TestHelperRemoteBidder(t *testing.T) {
	raw := os.Getenv(remoteBidderEnv)
	if raw == "" {
		t.Skip("the bidder host of TestNode_JoinsFromAnotherHost")
	}
	var spec remoteBidderSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatal(err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	s, err := node.New(node.Config{StateDir: spec.State, Binary: socialwebBin, ImageDir: spec.Images, DNSUpstream: "none",
		OverlayAddress: remoteBidHost})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, spec.State)
	bootNode(t, s, "far", spec.NodeName, tenant.NodeBundle{Server: spec.Server, Kubeconfig: spec.Kubeconfig, CAPEM: spec.CA})
	t.Logf("booted %s, joining %s", spec.NodeName, spec.Server)
	<-term
}
