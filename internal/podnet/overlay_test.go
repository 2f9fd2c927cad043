package podnet

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/substratetest"
)

// overlayHost is a namespace standing for a node: its link to the internet namespace
// (address addr/24, default route via gw), a pod address on lo, and its overlay.
type overlayHost struct {
	ns   substratetest.Netns
	addr string
	pod  string
	cidr netip.Prefix
	key  Key
	ov   *Overlay
}

func requireNetns(t testing.TB) {
	t.Helper()
	_, ipErr := exec.LookPath("ip")
	_, nsErr := exec.LookPath("nsenter")
	_, tunErr := os.Stat("/dev/net/tun")
	substratetest.Require(t, os.Geteuid() == 0 && ipErr == nil && nsErr == nil && tunErr == nil,
		"root, iproute2, nsenter and /dev/net/tun", "run as root with hack/install-guest-deps.sh")
}

// overlayNet makes the internet namespace and one node namespace per address (each on a
// link of its own to the internet, which forwards between them): nodes are joined only
// through it, as nodes on different hosts are.
func overlayNet(t testing.TB, nodes ...*overlayHost) substratetest.Netns {
	inet := substratetest.NewNetns(t, "swtinet")
	inet.Sysctl(t, "net.ipv4.ip_forward", "1")
	for i, h := range nodes {
		h.ns = substratetest.NewNetns(t, "swtnode")
		a := netip.MustParseAddr(h.addr)
		gw := a.As4()
		gw[3] = 1
		inetEnd := fmt.Sprintf("n%d", i)
		substratetest.Link(t, h.ns, "eth0", inet, inetEnd)
		h.ns.IP(t, "addr", "add", h.addr+"/24", "dev", "eth0")
		h.ns.IP(t, "link", "set", "eth0", "up")
		h.ns.IP(t, "route", "add", "default", "via", netip.AddrFrom4(gw).String())
		h.ns.IP(t, "addr", "add", h.pod+"/32", "dev", "lo")
		inet.IP(t, "addr", "add", netip.AddrFrom4(gw).String()+"/24", "dev", inetEnd)
		inet.IP(t, "link", "set", inetEnd, "up")
		k, err := NewPrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		h.key = k
		var serr error
		h.ns.In(t, func() {
			h.ov, serr = Start(Config{PrivateKey: k, ListenPort: 51820, Address: h.cidr.Addr(), Logf: func(f string, args ...any) {
				// wireguard-go reads the TUN's MTU through a socket of the calling thread's
				// namespace: a test's threads are the host's. A node runs wholly inside.
				if msg := fmt.Sprintf(f, args...); !strings.Contains(msg, "MTU") {
					t.Log(msg)
				}
			}})
		})
		if serr != nil {
			t.Fatal(serr)
		}
		t.Cleanup(h.ov.Close)
	}
	return inet
}

func peerOf(h *overlayHost) Peer {
	return Peer{Node: h.ns.Name, PublicKey: h.key.PublicKey(), Endpoint: netip.MustParseAddrPort(h.addr + ":51820"), AllowedIPs: []netip.Prefix{h.cidr}}
}

// peerWithAddress is peerOf(h) with h's node address carried too, as DesiredPeers gives it.
func peerWithAddress(h *overlayHost) Peer {
	p := peerOf(h)
	p.NodeAddress = netip.MustParseAddr(h.addr)
	p.AllowedIPs = append(p.AllowedIPs, netip.PrefixFrom(p.NodeAddress, 32))
	return p
}

// echoServer listens on addr inside ns and answers each connection with its peer's address.
func echoServer(t *testing.T, ns substratetest.Netns, addr string) {
	var ln net.Listener
	var err error
	ns.In(t, func() { ln, err = net.Listen("tcp", addr) })
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
			fmt.Fprintf(c, "%s\n", c.RemoteAddr())
			c.Close()
		}
	}()
}

// dialFrom connects from local (an address of ns) to addr and reads one line.
func dialFrom(t *testing.T, ns substratetest.Netns, local, addr string, timeout time.Duration) (string, error) {
	var line string
	var err error
	ns.In(t, func() {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		var c net.Conn
		if c, err = d.Dial("tcp", addr); err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		line, err = bufio.NewReader(c).ReadString('\n')
		if err == io.EOF && line != "" {
			err = nil
		}
	})
	return line, err
}

// reach dials from ns (source src) to addr until a connection answers or within has passed:
// the first packet waits for a WireGuard handshake, retried every 5 s, which a loaded host
// can take longer than one attempt to complete.
func reach(t *testing.T, ns substratetest.Netns, src, addr string, within time.Duration) (string, error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got, err := dialFrom(t, ns, src, addr, 5*time.Second)
		if err == nil || time.Now().After(deadline) {
			return got, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestOverlayJoinsPodSubnetsAndRefusesAnotherClustersNode: two nodes of a cluster, in
// namespaces joined only through a third that stands for the internet, reach each other's
// pod addresses by TCP through the overlay, with the pod address preserved; a node of
// another cluster that knows the target's public key and endpoint and claims the first
// node's pod range is refused, since the target only has the peers its own cluster lists.
func TestOverlayJoinsPodSubnetsAndRefusesAnotherClustersNode(t *testing.T) {
	requireNetns(t)
	a := &overlayHost{addr: "203.0.113.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}
	b := &overlayHost{addr: "198.51.100.2", pod: "10.42.2.10", cidr: netip.MustParsePrefix("10.42.2.0/24")}
	other := &overlayHost{addr: "192.0.2.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}
	overlayNet(t, a, b, other)

	if err := a.ov.SetPeers([]Peer{peerOf(b)}); err != nil {
		t.Fatal(err)
	}
	if err := b.ov.SetPeers([]Peer{peerOf(a)}); err != nil {
		t.Fatal(err)
	}
	// The other cluster's node makes b its peer; b's cluster does not list it.
	if err := other.ov.SetPeers([]Peer{peerOf(b)}); err != nil {
		t.Fatal(err)
	}
	echoServer(t, b.ns, b.pod+":8080")
	echoServer(t, a.ns, a.pod+":8080")

	got, err := reach(t, a.ns, a.pod, b.pod+":8080", 30*time.Second)
	if err != nil {
		t.Fatalf("pod on a -> pod on b through the overlay: %v", err)
	}
	if host, _, _ := net.SplitHostPort(got[:len(got)-1]); host != a.pod {
		t.Errorf("b saw the connection from %q, want a's pod address %s (no NAT on the overlay)", got, a.pod)
	}
	if _, err := reach(t, b.ns, b.pod, a.pod+":8080", 30*time.Second); err != nil {
		t.Fatalf("pod on b -> pod on a: %v", err)
	}

	if got, err := dialFrom(t, other.ns, other.pod, b.pod+":8080", 4*time.Second); err == nil {
		t.Fatalf("a node of another cluster reached b's pod through the overlay (b saw %q)", got)
	}

	// Removing a from b's peers ends a's access too (its session and its route go).
	if err := b.ov.SetPeers(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := dialFrom(t, a.ns, a.pod, b.pod+":8080", 3*time.Second); err == nil {
		t.Fatal("a still reaches b's pod after b dropped it as a peer")
	}
}

// TestOverlayCarriesPeerNodeAddresses: with the internet namespace forwarding only the
// overlay's UDP port between nodes (as the host does between node links), a pod address of
// node a connects by TCP to node b's own address through the overlay (a NodePort's way), b
// sees the pod's address, and the overlay's own packets to b's address (its endpoint) still
// leave by the node's link. A node of another cluster, which makes b a peer with b's address,
// reaches b's address neither through the overlay (b does not list it) nor directly.
func TestOverlayCarriesPeerNodeAddresses(t *testing.T) {
	requireNetns(t)
	a := &overlayHost{addr: "203.0.113.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}
	b := &overlayHost{addr: "198.51.100.2", pod: "10.42.2.10", cidr: netip.MustParsePrefix("10.42.2.0/24")}
	other := &overlayHost{addr: "192.0.2.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}
	inet := overlayNet(t, a, b, other)
	for _, rule := range [][]string{
		{"-A", "FORWARD", "-p", "udp", "--dport", "51820", "-j", "ACCEPT"},
		{"-A", "FORWARD", "-j", "DROP"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + inet.Path(), "--", "iptables", "-w"}, rule...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables %v: %v: %s", rule, err, out)
		}
	}
	if err := a.ov.SetPeers([]Peer{peerWithAddress(b)}); err != nil {
		t.Fatal(err)
	}
	if err := b.ov.SetPeers([]Peer{peerWithAddress(a)}); err != nil {
		t.Fatal(err)
	}
	if err := other.ov.SetPeers([]Peer{peerWithAddress(b)}); err != nil {
		t.Fatal(err)
	}
	echoServer(t, b.ns, b.addr+":8080")

	got, err := reach(t, a.ns, a.pod, b.addr+":8080", 30*time.Second)
	if err != nil {
		t.Fatalf("pod on a -> b's node address through the overlay: %v", err)
	}
	if host, _, _ := net.SplitHostPort(strings.TrimSpace(got)); host != a.pod {
		t.Errorf("b saw the connection from %q, want a's pod address %s", got, a.pod)
	}
	echoServer(t, b.ns, b.pod+":8080")
	if _, err := reach(t, a.ns, a.pod, b.pod+":8080", 30*time.Second); err != nil {
		t.Fatalf("pod on a -> pod on b: %v", err)
	}

	if got, err := dialFrom(t, other.ns, other.pod, b.addr+":8080", 4*time.Second); err == nil {
		t.Fatalf("a node of another cluster reached b's node address through the overlay (b saw %q)", got)
	}
	if got, err := dialFrom(t, other.ns, other.addr, b.addr+":8080", 3*time.Second); err == nil {
		t.Fatalf("a node of another cluster reached b's node address directly (b saw %q)", got)
	}

	// b dropping a as a peer takes the route and the access away.
	if err := b.ov.SetPeers(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := dialFrom(t, a.ns, a.pod, b.addr+":8080", 3*time.Second); err == nil {
		t.Fatal("a still reaches b's node address after b dropped it as a peer")
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	p := t.TempDir() + "/overlay.key"
	k, err := LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v: want 0600", fi.Mode().Perm(), err)
	}
	again, err := LoadOrCreateKey(p)
	if err != nil || again != k {
		t.Fatalf("second load: %v, same key %v", err, again == k)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(p); err == nil {
		t.Fatal("a key file others may read was accepted")
	}
}

// BenchmarkOverlayTCP is the throughput of one TCP stream from a pod address of one node to
// one of another, through the overlay (wireguard-go in this process for both ends; the
// nodes joined through a third namespace): bytes per second is the figure.
func BenchmarkOverlayTCP(b *testing.B) {
	requireNetns(b)
	a := &overlayHost{addr: "203.0.113.2", pod: "10.42.1.10", cidr: netip.MustParsePrefix("10.42.1.0/24")}
	c := &overlayHost{addr: "198.51.100.2", pod: "10.42.2.10", cidr: netip.MustParsePrefix("10.42.2.0/24")}
	overlayNet(b, a, c)
	if err := a.ov.SetPeers([]Peer{peerOf(c)}); err != nil {
		b.Fatal(err)
	}
	if err := c.ov.SetPeers([]Peer{peerOf(a)}); err != nil {
		b.Fatal(err)
	}
	var ln net.Listener
	var err error
	c.ns.In(b, func() { ln, err = net.Listen("tcp", c.pod+":9000") })
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		n, _ := io.Copy(io.Discard, conn)
		conn.Close()
		done <- n
	}()
	var conn net.Conn
	a.ns.In(b, func() {
		d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(a.pod)}}
		conn, err = d.Dial("tcp", c.pod+":9000")
	})
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	conn.Close()
	if n := <-done; n != int64(b.N)*int64(len(buf)) {
		b.Fatalf("received %d bytes, sent %d", n, int64(b.N)*int64(len(buf)))
	}
}

// TestOverlayLoosensStrictReversePath: the overlay makes reverse-path filtering loose in its
// namespace, for every interface (conf/all 2), since the peers' handshakes arrive on the node's
// link from addresses that, unmarked, route into the overlay: strict on that link (all 1, or
// the link's own 1) drops them.
func TestOverlayLoosensStrictReversePath(t *testing.T) {
	requireNetns(t)
	for _, before := range []string{"1", "0"} {
		ns := substratetest.NewNetns(t, "swtnode")
		ns.Sysctl(t, "net.ipv4.conf.all.rp_filter", before)
		ns.Sysctl(t, "net.ipv4.conf.lo.rp_filter", "1")
		k, err := NewPrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		var got []byte
		ns.In(t, func() {
			var ov *Overlay
			if ov, err = Start(Config{PrivateKey: k, ListenPort: 51820}); err != nil {
				return
			}
			defer ov.Close()
			got, err = os.ReadFile("/proc/sys/net/ipv4/conf/all/rp_filter")
		})
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(got)) != "2" {
			t.Fatalf("all.rp_filter %q after the overlay started (was %s), want 2 (loose)", got, before)
		}
	}
}
