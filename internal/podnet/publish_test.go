package podnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/substratetest"
)

func TestParsePortRange(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want PortRange
		bad  bool
	}{
		{in: "51821-52820", want: PortRange{51821, 52820}},
		{in: " 6000 ", want: PortRange{6000, 6000}},
		{in: "7-6", bad: true},
		{in: "0-10", bad: true},
		{in: "1-65536", bad: true},
		{in: "a-b", bad: true},
		{in: "", bad: true},
	} {
		got, err := ParsePortRange(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestChoosePort(t *testing.T) {
	r := PortRange{First: 100, Last: 102}
	for _, tc := range []struct {
		name string
		want uint16
		used []uint16
		got  uint16
		full bool
	}{
		{name: "a new node takes the lowest free port", used: []uint16{100}, got: 101},
		{name: "a restarted node keeps its port", want: 102, used: []uint16{100}, got: 102},
		{name: "a port another node took is not kept", want: 101, used: []uint16{101}, got: 100},
		{name: "a port outside the range (the range shrank) is not kept", want: 7, got: 100},
		{name: "a full range is an error", used: []uint16{100, 101, 102}, full: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			used := map[uint16]bool{}
			for _, p := range tc.used {
				used[p] = true
			}
			got, err := ChoosePort(r, tc.want, used)
			var full *NoOverlayPortError
			if tc.full != errors.As(err, &full) || got != tc.got {
				t.Fatalf("ChoosePort = %d, %v; want %d (full %v)", got, err, tc.got, tc.full)
			}
		})
	}
}

func TestPublishedPorts(t *testing.T) {
	listing := `-P PREROUTING ACCEPT
-N SWNO-1
-N SWNODE-OVERLAY
-A PREROUTING -j SWNODE-OVERLAY
-A SWNO-1 -d 198.51.100.2/32 -p udp -m udp --dport 51821 -j DNAT --to-destination 10.78.0.2:51820
-A SWNO-7 -d 198.51.100.2/32 -p udp -m udp --dport 51830 -j DNAT --to-destination 10.78.0.26:51820
-A SWNODE-OVERLAY -j SWNO-1
-A KUBE-X -p udp --dport 53 -j RETURN`
	got := publishedPorts(listing)
	if len(got) != 2 || got["SWNO-1"] != 51821 || got["SWNO-7"] != 51830 {
		t.Fatalf("publishedPorts = %v", got)
	}
}

// natHost is a namespace standing for a bidder's host: its public address on a link to the
// internet namespace, and one node namespace behind it on a node link, with the host's real
// forwarding (Host.Ensure, AddNode, PublishOverlay) between them.
type natHost struct {
	ns       substratetest.Netns
	public   netip.Addr
	node     *overlayHost
	endpoint netip.AddrPort
}

// TestOverlayAcrossHostsThroughPublishedEndpoints: two hosts, each with one node behind it
// whose link has the same address on both (hosts plan their node links independently),
// joined only through a namespace standing for the internet, which has no route to any node
// link. Each host publishes its node's overlay endpoint (a port of its public address,
// forwarded to the node), the nodes make each other peers at those endpoints, and a pod of
// one reaches a pod of the other, which sees the pod's own address. A second node of a host
// gets the next port; the first keeps its port when published again; RemoveNode takes the
// forwarding away.
func TestOverlayAcrossHostsThroughPublishedEndpoints(t *testing.T) {
	requireNetns(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("iptables is not installed")
	}
	inet := substratetest.NewNetns(t, "swtinet")
	inet.Sysctl(t, "net.ipv4.ip_forward", "1")
	ports := PortRange{First: 51821, Last: 51830}
	policy, err := ParseEgressPolicy(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	hosts := []*natHost{
		{public: netip.MustParseAddr("198.51.100.2"), node: &overlayHost{addr: "10.78.0.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}},
		{public: netip.MustParseAddr("203.0.113.2"), node: &overlayHost{addr: "10.78.0.2", pod: "10.42.2.10", cidr: netip.MustParsePrefix("10.42.2.0/24")}},
	}
	for i, h := range hosts {
		h.ns = substratetest.NewNetns(t, "swthost")
		gw := h.public.As4()
		gw[3] = 1
		end := fmt.Sprintf("h%d", i)
		substratetest.Link(t, h.ns, "up0", inet, end)
		h.ns.IP(t, "addr", "add", h.public.String()+"/30", "dev", "up0")
		h.ns.IP(t, "link", "set", "up0", "up")
		h.ns.IP(t, "route", "add", "default", "via", netip.AddrFrom4(gw).String())
		inet.IP(t, "addr", "add", netip.AddrFrom4(gw).String()+"/30", "dev", end)
		inet.IP(t, "link", "set", end, "up")

		n := h.node
		n.ns = substratetest.NewNetns(t, "swtnode")
		substratetest.Link(t, n.ns, "eth0", h.ns, "swn1")
		h.ns.IP(t, "addr", "add", "10.78.0.1/30", "dev", "swn1")
		h.ns.IP(t, "link", "set", "swn1", "up")
		n.ns.IP(t, "addr", "add", n.addr+"/30", "dev", "eth0")
		n.ns.IP(t, "link", "set", "eth0", "up")
		n.ns.IP(t, "route", "add", "default", "via", "10.78.0.1")
		n.ns.IP(t, "addr", "add", n.pod+"/32", "dev", "lo")

		host := Host{Netns: h.ns.Path()}
		if err := host.Ensure(); err != nil {
			t.Fatal(err)
		}
		if err := host.AddNode("swn1", policy); err != nil {
			t.Fatal(err)
		}
		if h.endpoint, err = host.PublishOverlay("swn1", netip.MustParseAddr(n.addr), h.public, ports, 0); err != nil {
			t.Fatal(err)
		}
		if want := netip.AddrPortFrom(h.public, ports.First); h.endpoint != want {
			t.Fatalf("published endpoint %s, want %s", h.endpoint, want)
		}
		if n.key, err = NewPrivateKey(); err != nil {
			t.Fatal(err)
		}
		var serr error
		n.ns.In(t, func() {
			n.ov, serr = Start(Config{PrivateKey: n.key, ListenPort: 51820, Address: n.cidr.Addr(), Logf: func(f string, args ...any) {
				if msg := fmt.Sprintf(f, args...); !strings.Contains(msg, "MTU") {
					t.Log(msg)
				}
			}})
		})
		if serr != nil {
			t.Fatal(serr)
		}
		t.Cleanup(n.ov.Close)
	}
	a, b := hosts[0], hosts[1]
	peer := func(h *natHost) Peer {
		return Peer{Node: h.node.ns.Name, PublicKey: h.node.key.PublicKey(), Endpoint: h.endpoint, AllowedIPs: []netip.Prefix{h.node.cidr}}
	}
	if err := a.node.ov.SetPeers([]Peer{peer(b)}); err != nil {
		t.Fatal(err)
	}
	if err := b.node.ov.SetPeers([]Peer{peer(a)}); err != nil {
		t.Fatal(err)
	}
	echoServer(t, b.node.ns, b.node.pod+":8080")
	echoServer(t, a.node.ns, a.node.pod+":8080")
	got, err := reach(t, a.node.ns, a.node.pod, b.node.pod+":8080", 30*time.Second)
	if err != nil {
		t.Fatalf("pod on host a's node -> pod on host b's node through the published endpoints: %v", err)
	}
	if host, _, _ := net.SplitHostPort(strings.TrimSpace(got)); host != a.node.pod {
		t.Errorf("b saw the connection from %q, want a's pod address %s (nothing rewritten inside the overlay)", got, a.node.pod)
	}
	if _, err := reach(t, b.node.ns, b.node.pod, a.node.pod+":8080", 30*time.Second); err != nil {
		t.Fatalf("pod on host b's node -> pod on host a's node: %v", err)
	}

	host := Host{Netns: a.ns.Path()}
	second, err := host.PublishOverlay("swn2", netip.MustParseAddr("10.78.0.6"), a.public, ports, 0)
	if err != nil || second.Port() != ports.First+1 {
		t.Fatalf("a second node of host a got %s, %v; want port %d", second, err, ports.First+1)
	}
	if again, err := host.PublishOverlay("swn1", netip.MustParseAddr(a.node.addr), a.public, ports, 0); err != nil || again != a.endpoint {
		t.Fatalf("publishing host a's first node again gave %s, %v; want its endpoint %s kept", again, err, a.endpoint)
	}
	// A node published at a port of its own keeps it when published again without one
	// (lower ports being free).
	third, err := host.PublishOverlay("swn3", netip.MustParseAddr("10.78.0.10"), a.public, ports, ports.First+5)
	if err != nil || third.Port() != ports.First+5 {
		t.Fatalf("a third node asking for port %d got %s, %v", ports.First+5, third, err)
	}
	if again, err := host.PublishOverlay("swn3", netip.MustParseAddr("10.78.0.10"), a.public, ports, 0); err != nil || again != third {
		t.Fatalf("publishing the third node again gave %s, %v; want %s kept", again, err, third)
	}
	for _, link := range []string{"swn1", "swn2", "swn3"} {
		if err := host.RemoveNode(link); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("nsenter", "--net="+a.ns.Path(), "--", "iptables", "-w", "-t", "nat", "-S").CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Contains(string(out), "SWNO-") {
		t.Errorf("RemoveNode left forwarding behind:\n%s", out)
	}
	if _, err := dialFrom(t, b.node.ns, b.node.pod, a.node.pod+":8080", 3*time.Second); err == nil {
		t.Error("b still reaches a's pod after host a stopped forwarding a's endpoint")
	}
}
