package podnet

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/substratetest"
)

func TestParseEgressPolicy(t *testing.T) {
	for _, tc := range []struct {
		allow, deny []string
		wantAllow   string
		wantDenyAdd string // the operator's denies after the defaults
		err         string
	}{
		{},
		{allow: []string{"10.1.2.3", "10.9.0.0/16"}, deny: []string{"8.8.8.0/24"}, wantAllow: "10.1.2.3/32 10.9.0.0/16", wantDenyAdd: "8.8.8.0/24"},
		{deny: []string{"10.0.0.0/8", " 1.2.3.4/8 "}, wantDenyAdd: "1.0.0.0/8"}, // a default is not repeated; masked
		{allow: []string{"fd00::/8"}, err: "IPv4"},
		{deny: []string{"example.com"}, err: "IPv4"},
	} {
		p, err := ParseEgressPolicy(tc.allow, tc.deny)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v %v: err %v, want %q", tc.allow, tc.deny, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		allow, deny := p.Strings()
		if strings.Join(allow, " ") != tc.wantAllow {
			t.Errorf("allow %v, want %s", allow, tc.wantAllow)
		}
		if got := strings.Join(deny[len(DefaultDeny):], " "); got != tc.wantDenyAdd || strings.Join(deny[:len(DefaultDeny)], " ") != strings.Join(DefaultDeny, " ") {
			t.Errorf("deny %v, want the defaults then %s", deny, tc.wantDenyAdd)
		}
	}
}

func TestNodeChainRulesOrder(t *testing.T) {
	p, err := ParseEgressPolicy([]string{"10.1.0.0/16"}, []string{"8.8.8.8"})
	if err != nil {
		t.Fatal(err)
	}
	p.DNS = []netip.AddrPort{netip.MustParseAddrPort("10.255.255.53:53")}
	var lines []string
	for _, r := range NodeChainRules(p) {
		lines = append(lines, strings.Join(r, " "))
	}
	all := strings.Join(lines, "\n")
	idx := func(s string) int {
		i := strings.Index(all, s)
		if i < 0 {
			t.Fatalf("rules lack %q:\n%s", s, all)
		}
		return i
	}
	// The overlay's UDP first; the host's own addresses and the always-denied ranges
	// before the operator's allows (an allow of 10/8 never opens the node links, the pod
	// or service networks, or link-local); allows before the deny list; accept last.
	order := []string{
		"-o swn+ -d 10.78.0.0/15 -p udp --dport 51820 -j ACCEPT",
		"--dst-type LOCAL -j DROP",
		"-d 10.255.255.53/32 -p udp --dport 53 -j ACCEPT", "-d 10.255.255.53/32 -p tcp --dport 53 -j ACCEPT",
		"-d 10.78.0.0/15 -j DROP", "-d 169.254.0.0/16 -j DROP",
		"-d 10.1.0.0/16 -j ACCEPT",
		"-d 10.0.0.0/8 -j DROP", "-d 8.8.8.8/32 -j DROP",
	}
	for i := 1; i < len(order); i++ {
		if idx(order[i-1]) > idx(order[i]) {
			t.Errorf("%q comes after %q:\n%s", order[i-1], order[i], all)
		}
	}
	if lines[len(lines)-1] != "-j ACCEPT" {
		t.Errorf("last rule %q, want -j ACCEPT", lines[len(lines)-1])
	}
}

func TestSameRules(t *testing.T) {
	listing := "-N SWN-x\n-A SWN-x -d 10.0.0.0/8 -j DROP\n-A SWN-x -d 8.8.8.8/32 -p udp -m udp --dport 53 -j ACCEPT\n-A SWN-x -m addrtype --dst-type LOCAL -j DROP\n"
	want := [][]string{{"-d", "10.0.0.0/8", "-j", "DROP"}, {"-p", "udp", "-d", "8.8.8.8", "--dport", "53", "-j", "ACCEPT"}, {"-m", "addrtype", "--dst-type", "LOCAL", "-j", "DROP"}}
	if !sameRules(listing, "SWN-x", want) {
		t.Error("the same rules in iptables' own form were not recognised")
	}
	if sameRules(listing, "SWN-x", want[:2]) || sameRules(listing, "SWN-x", [][]string{want[1], want[0], want[2]}) {
		t.Error("fewer or reordered rules were taken for the same")
	}
}

// egressNet is a namespace standing for a bidder host with one node on a node link, the
// internet behind a link of its own, a private network (172.16.77.0/30, with a server that
// also answers at 169.254.169.254) and another cluster's node on a second node link.
type egressNet struct {
	host, node, other, private substratetest.Netns
	internet                   *substratetest.Internet
	nodeLink, otherLink        string
}

func newEgressNet(t *testing.T) *egressNet {
	e := &egressNet{}
	e.host = substratetest.NewNetns(t, "swthost")
	e.node = substratetest.NewNetns(t, "swtnode")
	e.other = substratetest.NewNetns(t, "swtnode")
	e.private = substratetest.NewNetns(t, "swtpriv")
	e.nodeLink, e.otherLink = "swntest0", "swntest1"
	h := e.host
	for _, l := range []struct {
		ns                 substratetest.Netns
		link, hostIP, nsIP string
	}{{e.node, e.nodeLink, "10.78.200.1", "10.78.200.2"}, {e.other, e.otherLink, "10.78.200.5", "10.78.200.6"}} {
		substratetest.Link(t, h, l.link, l.ns, "eth0")
		h.IP(t, "addr", "add", l.hostIP+"/30", "dev", l.link)
		h.IP(t, "link", "set", l.link, "up")
		h.Sysctl(t, "net.ipv4.conf."+l.link+".rp_filter", "1")
		l.ns.IP(t, "addr", "add", l.nsIP+"/30", "dev", "eth0")
		l.ns.IP(t, "link", "set", "eth0", "up")
		l.ns.IP(t, "route", "add", "default", "via", l.hostIP)
	}
	// A pod address inside the node (a pod's packet has it as its source).
	e.node.IP(t, "addr", "add", "10.42.0.10/32", "dev", "lo")

	// The internet, as substratetest.NewInternet makes it, but behind this host.
	inet := substratetest.NewNetns(t, "swtinet")
	e.internet = &substratetest.Internet{Netns: inet, HTTP: substratetest.InternetHTTPIP + ":80", Body: "hello from the internet namespace"}
	substratetest.Link(t, h, "inet", inet, "eth0")
	h.IP(t, "addr", "add", substratetest.InternetHostIP+"/30", "dev", "inet")
	h.IP(t, "link", "set", "inet", "up")
	inet.IP(t, "addr", "add", substratetest.InternetPeerIP+"/30", "dev", "eth0")
	inet.IP(t, "link", "set", "eth0", "up")
	inet.IP(t, "addr", "add", substratetest.InternetHTTPIP+"/32", "dev", "lo")
	h.IP(t, "route", "add", substratetest.InternetCIDR, "via", substratetest.InternetPeerIP)
	serveHTTP(t, inet, e.internet.HTTP, e.internet.Body)

	substratetest.Link(t, h, "priv", e.private, "eth0")
	h.IP(t, "addr", "add", "172.16.77.1/30", "dev", "priv")
	h.IP(t, "link", "set", "priv", "up")
	e.private.IP(t, "addr", "add", "172.16.77.2/30", "dev", "eth0")
	e.private.IP(t, "addr", "add", "169.254.169.254/32", "dev", "lo")
	e.private.IP(t, "link", "set", "eth0", "up")
	e.private.IP(t, "route", "add", "default", "via", "172.16.77.1")
	h.IP(t, "route", "add", "169.254.169.254/32", "via", "172.16.77.2")
	serveHTTP(t, e.private, "0.0.0.0:80", "private")
	serveHTTP(t, e.private, "172.16.77.2:53", "a resolver on the private network")
	serveHTTP(t, e.other, "10.78.200.6:10250", "another cluster's node")
	serveHTTP(t, e.node, "10.78.200.2:10250", "this node")
	return e
}

func serveHTTP(t *testing.T, ns substratetest.Netns, addr, body string) {
	var ln net.Listener
	var err error
	ns.In(t, func() { ln, err = net.Listen("tcp", addr) })
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// get fetches http://addr/ from ns with local as the source address (the connection is
// made on a thread inside ns; an http.Client would dial on threads of the host).
func get(t *testing.T, ns substratetest.Netns, local, addr string) (string, error) {
	var c net.Conn
	var err error
	ns.In(t, func() {
		d := &net.Dialer{Timeout: 2 * time.Second}
		if local != "" {
			d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
		}
		c, err = d.Dial("tcp", addr)
	})
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", addr); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// TestEgressReachesTheInternetAndNothingOfTheHost: a pod's packet leaves its node
// masqueraded, crosses the host's chain and reaches a server in the internet namespace;
// private addresses, link-local (a metadata address) and another cluster's node are dropped,
// and nothing new enters the node's link. Removing the node removes its chain and jump, and
// leaves the other node's in place.
func TestEgressReachesTheInternetAndNothingOfTheHost(t *testing.T) {
	requireNetns(t)
	_, err := exec.LookPath("iptables")
	substratetest.Require(t, err == nil, "iptables", "hack/install-guest-deps.sh")
	e := newEgressNet(t)
	host := Host{Netns: e.host.Path()}
	if err := host.Ensure(); err != nil {
		t.Fatal(err)
	}
	p, err := ParseEgressPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.DNS = []netip.AddrPort{netip.MustParseAddrPort("172.16.77.2:53")}
	for _, l := range []string{e.nodeLink, e.otherLink} {
		if err := host.AddNode(l, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := host.Ensure(); err != nil { // a second state dir's node ensures the same
		t.Fatal(err)
	}
	if err := EnsureNodeMasq(e.node.Path()); err != nil {
		t.Fatal(err)
	}
	pod := "10.42.0.10"

	if body, err := get(t, e.node, pod, e.internet.HTTP); err != nil || body != e.internet.Body {
		t.Fatalf("pod -> internet %s: %q, %v", e.internet.HTTP, body, err)
	}
	// The bidder's DNS upstream on its private network: its DNS port only.
	if body, err := get(t, e.node, pod, "172.16.77.2:53"); err != nil {
		t.Errorf("pod -> the DNS upstream's port 53: %q, %v", body, err)
	}
	for _, target := range []string{"172.16.77.2:80", "169.254.169.254:80", "10.78.200.6:10250"} {
		if body, err := get(t, e.node, pod, target); err == nil {
			t.Errorf("pod reached %s (%q)", target, body)
		}
	}
	if body, err := get(t, e.other, "", "10.78.200.2:10250"); err == nil {
		t.Errorf("another node opened a connection into this node's link (%q)", body)
	}
	// Someone on the internet side who routes the node network to this host.
	e.internet.IP(t, "route", "add", "10.78.0.0/16", "via", substratetest.InternetHostIP)
	if body, err := get(t, e.internet.Netns, substratetest.InternetHTTPIP, "10.78.200.2:10250"); err == nil {
		t.Errorf("the internet opened a connection into this node's link (%q)", body)
	}

	// Teardown of one node: its chain and jump go; the other's stay.
	if err := host.RemoveNode(e.nodeLink); err != nil {
		t.Fatal(err)
	}
	if err := host.RemoveNode(e.nodeLink); err != nil {
		t.Fatalf("second removal: %v", err)
	}
	listing, _ := iptables(e.host.Path(), "-S")
	if strings.Contains(listing, NodeChain(e.nodeLink)) {
		t.Errorf("the removed node's chain is left:\n%s", listing)
	}
	if !strings.Contains(listing, fmt.Sprintf("-A %s -i %s -j %s", ChainEgress, e.otherLink, NodeChain(e.otherLink))) {
		t.Errorf("the other node's jump went too:\n%s", listing)
	}
	if body, err := get(t, e.node, pod, e.internet.HTTP); err == nil {
		t.Errorf("a node link without its chain still forwards (%q)", body)
	}
}

// TestHostChainsStayWholeUnderConcurrentNodes: nodes of several state dirs ensure the shared
// chains and add their own at once; the shared chains hold their rules once, each node its
// jump once, and removing some leaves the others'.
func TestHostChainsStayWholeUnderConcurrentNodes(t *testing.T) {
	requireNetns(t)
	_, err := exec.LookPath("iptables")
	substratetest.Require(t, err == nil, "iptables", "hack/install-guest-deps.sh")
	host := Host{Netns: substratetest.NewNetns(t, "swthost").Path()}
	p, err := ParseEgressPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		link := fmt.Sprintf("swnc%d", i)
		go func() {
			err := host.Ensure()
			if err == nil {
				err = host.AddNode(link, p)
			}
			errs <- err
		}()
	}
	for i := 0; i < 6; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		if err := host.RemoveNode(fmt.Sprintf("swnc%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	count := func(table, chain, rule string) int {
		out, err := iptables(host.Netns, "-t", table, "-S", chain)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(out, rule+"\n")
	}
	for _, j := range ForwardJumps() {
		if n := count("filter", "FORWARD", "-A FORWARD "+strings.Join(j, " ")); n != 1 {
			t.Errorf("FORWARD holds %q %d times", j, n)
		}
	}
	out, _ := iptables(host.Netns, "-S", ChainForward)
	if !sameRules(out, ChainForward, ForwardRules()) {
		t.Errorf("%s:\n%s", ChainForward, out)
	}
	for i := 0; i < 6; i++ {
		link := fmt.Sprintf("swnc%d", i)
		want := 1
		if i < 3 {
			want = 0
		}
		if n := count("filter", ChainEgress, "-A "+ChainEgress+" "+strings.Join(EgressJump(link), " ")); n != want {
			t.Errorf("%s holds %s's jump %d times, want %d", ChainEgress, link, n, want)
		}
	}
	if n := count("nat", "POSTROUTING", "-A POSTROUTING -j "+ChainHostNAT); n != 1 {
		t.Errorf("nat POSTROUTING jumps to %s %d times", ChainHostNAT, n)
	}
}

func TestEgressPolicyReaches(t *testing.T) {
	p, err := ParseEgressPolicy([]string{"10.1.2.0/24", "127.0.0.1", "169.254.169.254"}, []string{"198.51.100.0/24"})
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{
		"203.0.113.7":     true,  // the internet
		"10.1.2.3":        true,  // an operator's hole in the private ranges
		"10.1.3.3":        false, // the rest of them
		"192.168.1.1":     false,
		"198.51.100.9":    false, // the operator's own deny
		"127.0.0.1":       false, // always denied, whatever is allowed
		"169.254.169.254": false,
		"10.78.0.6":       false, // the node links
		"10.42.0.5":       false, // the pod network
		"10.43.0.1":       false, // the service network
		"0.0.0.0":         false,
		"::1":             false,
	} {
		if got := p.Reaches(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Reaches(%s) = %v, want %v", addr, got, want)
		}
	}
}
