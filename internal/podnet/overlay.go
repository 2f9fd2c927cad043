package podnet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/crypto/curve25519"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun"
)

// Defaults of a node's overlay device.
const (
	// InterfaceName is the overlay's TUN device inside a node's network namespace.
	InterfaceName = "swwg0"
	// MTU leaves room for WireGuard's 60 bytes (IPv4, UDP, its header and tag) inside the
	// node link's 1500.
	MTU = 1420
	// KeepaliveSeconds keeps each peer's NAT mapping (the host masquerades nothing between
	// nodes, but a node on another host sits behind its provider's NAT) and its session warm.
	KeepaliveSeconds = 25
	// FirewallMark is on every packet wireguard-go sends (SO_MARK on its UDP sockets), as
	// wg-quick marks its own. It avoids kube-proxy's bits (0x4000 masquerade, 0x8000 drop)
	// and the NetworkPolicy engine's (0x10000, 0x20000).
	FirewallMark = 0x518
	// NodeRouteTable holds the routes to the peers' node addresses. Only packets without
	// FirewallMark consult it (`ip rule not fwmark FirewallMark table NodeRouteTable`): a
	// peer's endpoint is its node address, and the overlay's own UDP packets to it must
	// leave by the node's link, not loop into the overlay.
	NodeRouteTable = 51820
)

// PublicKey is the public key of private key k.
func (k Key) PublicKey() Key {
	var pub Key
	p, _ := curve25519.X25519(k[:], curve25519.Basepoint)
	copy(pub[:], p)
	return pub
}

// NewPrivateKey makes a new Curve25519 private key (clamped, as WireGuard's).
func NewPrivateKey() (Key, error) {
	var k Key
	if _, err := rand.Read(k[:]); err != nil {
		return k, err
	}
	k[0] &= 248
	k[31] = (k[31] & 127) | 64
	return k, nil
}

// LoadOrCreateKey reads the private key in path (mode 0600, base64), or makes one there. A
// key file anyone but its owner may read is refused: it is the node's identity in the
// overlay.
func LoadOrCreateKey(path string) (Key, error) {
	if b, err := os.ReadFile(path); err == nil {
		fi, err := os.Stat(path)
		if err != nil {
			return Key{}, err
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return Key{}, fmt.Errorf("overlay key %s has mode %v: want 0600", path, fi.Mode().Perm())
		}
		return ParseKey(strings.TrimSpace(string(b)))
	} else if !errors.Is(err, os.ErrNotExist) {
		return Key{}, err
	}
	k, err := NewPrivateKey()
	if err != nil {
		return Key{}, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Key{}, err
	}
	_, err = f.WriteString(k.String() + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return k, err
}

// Config configures a node's overlay device.
type Config struct {
	// Name of the TUN device (InterfaceName when empty).
	Name string
	// PrivateKey is the node's overlay key.
	PrivateKey Key
	// ListenPort is the UDP port of the node's endpoint (clusternet.OverlayPort).
	ListenPort int
	// Address, when valid, is put on the device (/32): the source of the node's own
	// traffic into the overlay, so a peer's AllowedIPs (this node's pod CIDR) admit it.
	// Flannel's WireGuard backend uses the pod CIDR's network address the same way.
	Address netip.Addr
	// Logf hears of the device's errors.
	Logf func(format string, args ...any)
}

// Overlay is a running WireGuard device (wireguard-go in this process) and the routes to
// its peers' pod CIDRs (main table) and node addresses (NodeRouteTable, which the device's
// own marked packets skip).
type Overlay struct {
	name  string
	dev   *device.Device
	nl    *netlink.Handle
	bind  *netnsBind
	index int

	mu     sync.Mutex
	peers  map[Key]Peer
	routes map[overlayRoute]bool
	src    netip.Addr
}

// overlayRoute is a route through the device: a pod CIDR in the main table, a peer's node
// address in NodeRouteTable.
type overlayRoute struct {
	dst   netip.Prefix
	table int
}

// Start creates the TUN device in the network namespace of the calling thread (a caller
// that entered a namespace locks its OS thread), brings wireguard-go up on it with the
// private key and the listen port (its UDP sockets are made in that namespace too), and
// puts Address on it. The device's file descriptors keep their namespace: later calls may
// run on any thread.
func Start(cfg Config) (*Overlay, error) {
	if cfg.Name == "" {
		cfg.Name = InterfaceName
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	// Routes, rules and addresses only: a handle of every family also opens xfrm and
	// netfilter sockets, which a kernel with those as unloaded modules refuses (a vm node's).
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	td, err := tun.CreateTUN(cfg.Name, MTU)
	if err != nil {
		nl.Close()
		return nil, fmt.Errorf("create TUN %s: %w (is /dev/net/tun there?)", cfg.Name, err)
	}
	logger := &device.Logger{
		Verbosef: func(string, ...any) {},
		Errorf:   func(format string, args ...any) { cfg.Logf("overlay: "+format, args...) },
	}
	bind, err := newNetnsBind()
	if err != nil {
		td.Close()
		nl.Close()
		return nil, err
	}
	dev := device.NewDevice(td, bind, logger)
	o := &Overlay{name: cfg.Name, dev: dev, nl: nl, bind: bind, peers: map[Key]Peer{}, routes: map[overlayRoute]bool{}, src: cfg.Address}
	fail := func(err error) (*Overlay, error) {
		o.Close()
		return nil, err
	}
	if err := dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=%d\nfwmark=%d\n", hex.EncodeToString(cfg.PrivateKey[:]), cfg.ListenPort, FirewallMark)); err != nil {
		return fail(fmt.Errorf("configure %s: %w", cfg.Name, err))
	}
	if err := dev.Up(); err != nil {
		return fail(fmt.Errorf("bring %s up (UDP port %d): %w", cfg.Name, cfg.ListenPort, err))
	}
	link, err := nl.LinkByName(cfg.Name)
	if err != nil {
		return fail(err)
	}
	o.index = link.Attrs().Index
	if cfg.Address.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: cfg.Address.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		if err := nl.AddrReplace(link, a); err != nil {
			return fail(fmt.Errorf("address %s on %s: %w", cfg.Address, cfg.Name, err))
		}
	}
	if err := nl.LinkSetUp(link); err != nil {
		return fail(fmt.Errorf("set %s up: %w", cfg.Name, err))
	}
	if err := ensureUnmarkedRule(nl); err != nil {
		return fail(err)
	}
	if err := looseReversePath(); err != nil {
		return fail(err)
	}
	return o, nil
}

// unmarkedRule is `ip rule add not fwmark FirewallMark table NodeRouteTable`.
func unmarkedRule() *netlink.Rule {
	r := netlink.NewRule()
	r.Family = netlink.FAMILY_V4
	r.Table = NodeRouteTable
	r.Mark = FirewallMark
	mask := uint32(FirewallMark)
	r.Mask = &mask
	r.Invert = true
	return r
}

// ensureUnmarkedRule adds unmarkedRule unless the namespace has it (the device was started
// before in this namespace).
func ensureUnmarkedRule(nl *netlink.Handle) error {
	want := unmarkedRule()
	rules, err := nl.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list routing rules: %w", err)
	}
	for _, r := range rules {
		if r.Table == want.Table && r.Invert && r.Mark == want.Mark && r.Mask != nil && *r.Mask == *want.Mask {
			return nil
		}
	}
	if err := nl.RuleAdd(want); err != nil {
		return fmt.Errorf("routing rule not fwmark %#x table %d: %w", FirewallMark, NodeRouteTable, err)
	}
	return nil
}

// looseReversePath makes reverse-path filtering loose in the namespace (conf/all 2, which
// is the least the kernel applies to every interface, so a strict interface becomes loose
// too): a peer's packets to the overlay's UDP port arrive on the node's link from the peer's
// node address, which (unmarked, as every received packet) routes into the overlay, so a
// strict check would drop every handshake. Loose still drops a source routed nowhere, which
// is more than off (0) does.
func looseReversePath() error {
	const all = "/proc/sys/net/ipv4/conf/all/rp_filter"
	b, err := os.ReadFile(all)
	if err != nil {
		return fmt.Errorf("read %s: %w", all, err)
	}
	if strings.TrimSpace(string(b)) == "2" {
		return nil
	}
	if err := os.WriteFile(all, []byte("2"), 0o644); err != nil {
		return fmt.Errorf("loose reverse-path filtering: %w", err)
	}
	return nil
}

// Name is the device's interface name.
func (o *Overlay) Name() string { return o.name }

// SetPeers makes the device's peers exactly peers: a peer no longer listed is removed (its
// session ends, its routes go), one listed is added or updated in place (its session is
// kept), and each peer's AllowedIPs are routed through the device.
func (o *Overlay) SetPeers(peers []Peer) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	want := map[Key]Peer{}
	wantRoutes := map[overlayRoute]bool{}
	for _, p := range peers {
		want[p.PublicKey] = p
		for _, c := range p.AllowedIPs {
			r := overlayRoute{dst: c, table: unix.RT_TABLE_MAIN}
			if p.NodeAddress.IsValid() && c == netip.PrefixFrom(p.NodeAddress, 32) {
				r.table = NodeRouteTable
			}
			wantRoutes[r] = true
		}
	}
	var b strings.Builder
	for k := range o.peers {
		if _, ok := want[k]; !ok {
			fmt.Fprintf(&b, "public_key=%s\nremove=true\n", hex.EncodeToString(k[:]))
		}
	}
	for _, p := range peers {
		fmt.Fprintf(&b, "public_key=%s\nendpoint=%s\npersistent_keepalive_interval=%d\nreplace_allowed_ips=true\n",
			hex.EncodeToString(p.PublicKey[:]), p.Endpoint, KeepaliveSeconds)
		for _, c := range p.AllowedIPs {
			fmt.Fprintf(&b, "allowed_ip=%s\n", c)
		}
	}
	if b.Len() > 0 {
		if err := o.dev.IpcSet(b.String()); err != nil {
			return fmt.Errorf("overlay peers: %w", err)
		}
	}
	o.peers = want
	var errs []error
	for c := range o.routes {
		if !wantRoutes[c] {
			if err := o.nl.RouteDel(o.route(c)); err != nil && !errors.Is(err, errNoSuchRoute) && !isESRCH(err) {
				errs = append(errs, fmt.Errorf("route %s table %d: %w", c.dst, c.table, err))
				continue
			}
			delete(o.routes, c)
		}
	}
	for _, c := range sortedRoutes(wantRoutes) {
		if err := o.nl.RouteReplace(o.route(c)); err != nil {
			errs = append(errs, fmt.Errorf("route %s via %s table %d: %w", c.dst, o.name, c.table, err))
			continue
		}
		o.routes[c] = true
	}
	return errors.Join(errs...)
}

var errNoSuchRoute = errors.New("no such route")

func isESRCH(err error) bool { return strings.Contains(err.Error(), "no such process") }

func (o *Overlay) route(c overlayRoute) *netlink.Route {
	r := &netlink.Route{
		LinkIndex: o.index,
		Dst:       &net.IPNet{IP: c.dst.Addr().AsSlice(), Mask: net.CIDRMask(c.dst.Bits(), 32)},
		Scope:     netlink.SCOPE_LINK,
		Table:     c.table,
	}
	if o.src.IsValid() {
		r.Src = o.src.AsSlice()
	}
	return r
}

func sortedRoutes(m map[overlayRoute]bool) []overlayRoute {
	out := make([]overlayRoute, 0, len(m))
	for r := range m {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].table != out[j].table {
			return out[i].table < out[j].table
		}
		return out[i].dst.String() < out[j].dst.String()
	})
	return out
}

// Close removes the device (and with it its routes) and ends wireguard-go.
func (o *Overlay) Close() {
	if o.dev != nil {
		o.dev.Close() // closes the TUN, which removes the interface
	}
	if o.nl != nil {
		_ = o.nl.RuleDel(unmarkedRule())
		o.nl.Close()
	}
	if o.bind != nil {
		o.bind.ns.Close()
	}
}
