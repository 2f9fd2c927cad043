package substratetest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"

	"socialweb.computer/internal/netns"
)

// Network namespaces a test makes for itself: nodes, and a namespace that stands for the
// internet. Their addresses are from the documentation range 198.51.100.0/24, which the
// world routes nowhere: nothing outside this machine is ever a target. The other two
// documentation ranges are left to the host: a host may hold 192.0.2.0/24 on its LAN, and
// reach its package mirrors in 203.0.113.0/24 (this project's CI machines do both), so a
// route of a test there would take the mirrors away from every other test running. Every
// namespace, link and route is removed when the test ends.

// Netns is a network namespace under /run/netns.
type Netns struct {
	Name string
}

// Path is the namespace's file.
func (n Netns) Path() string { return "/run/netns/" + n.Name }

// NewNetns makes a namespace named prefix-<random> with lo up; it is deleted (with its end
// of every veth pair) when the test ends.
func NewNetns(t testing.TB, prefix string) Netns {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	n := Netns{Name: prefix + "-" + hex.EncodeToString(b)}
	MustIP(t, "netns", "add", n.Name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.Name).Run() })
	MustIP(t, "-n", n.Name, "link", "set", "lo", "up")
	return n
}

// MustIP runs ip with args, failing the test on an error.
func MustIP(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// In runs f on a thread inside namespace n (InNetns), failing the test when the thread
// cannot enter it. Sockets f opens stay in n.
func (n Netns) In(t testing.TB, f func()) {
	t.Helper()
	if err := InNetns(n.Path(), f); err != nil {
		t.Fatal(err)
	}
}

// InNetns runs f inside the network namespace at path (netns.Do: on a thread of its own
// that comes back before it runs anything else). Sockets f opens stay in the namespace. The
// error is entering or leaving it.
func InNetns(path string, f func()) error {
	return netns.Do(path, func() error { f(); return nil })
}

// Sysctl writes value to /proc/sys/<key> inside namespace n (a net.* key).
func (n Netns) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	if out, err := exec.Command("nsenter", "--net="+n.Path(), "--", "sh", "-c", "echo "+value+" > "+path).CombinedOutput(); err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v: %s", key, value, n.Name, err, out)
	}
}

// Link joins a and b by a veth pair: end aName in a, end bName in b; a zero Netns is the
// host. The pair goes with either namespace; a host end is deleted when the test ends.
func Link(t testing.TB, a Netns, aName string, b Netns, bName string) {
	t.Helper()
	args := []string{"link", "add", aName}
	if a.Name != "" {
		args = append(args, "netns", a.Name)
	}
	args = append(args, "type", "veth", "peer", "name", bName)
	if b.Name != "" {
		args = append(args, "netns", b.Name)
	}
	MustIP(t, args...)
	for _, e := range []struct {
		ns   Netns
		name string
	}{{a, aName}, {b, bName}} {
		if e.ns.Name == "" {
			name := e.name
			t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
		}
	}
}

// IP runs `ip -n NS args...` (the host's ip when n is zero).
func (n Netns) IP(t testing.TB, args ...string) {
	t.Helper()
	if n.Name != "" {
		args = append([]string{"-n", n.Name}, args...)
	}
	MustIP(t, args...)
}

// Internet is a namespace that stands for the internet, reached from the host through a
// veth pair and a host route: the host end holds 198.51.100.1/30, the namespace end
// 198.51.100.2/30, and 198.51.100.64/26 lies behind it (its addresses on the namespace's lo).
type Internet struct {
	Netns
	// HostLink is the host's end of the pair.
	HostLink string
	// HTTP is an HTTP server in the namespace (198.51.100.80:80) answering every request
	// with Body.
	HTTP string
	Body string
}

// Internet addresses.
const (
	InternetHostIP = "198.51.100.1"
	InternetPeerIP = "198.51.100.2"
	InternetCIDR   = "198.51.100.64/26"
	InternetHTTPIP = "198.51.100.80"
)

// NewInternet makes the internet namespace, its link and route on the host, and its HTTP
// server. The addresses are fixed: a test that makes it holds HostExclusive "internet"
// until it ends, and another waits for it.
func NewInternet(t testing.TB) *Internet {
	t.Helper()
	HostExclusive(t, "internet")
	n := NewNetns(t, "swinet")
	in := &Internet{Netns: n, HostLink: "swi" + n.Name[len("swinet-"):], HTTP: InternetHTTPIP + ":80", Body: "hello from the internet namespace"}
	Link(t, Netns{}, in.HostLink, n, "eth0")
	MustIP(t, "addr", "add", InternetHostIP+"/30", "dev", in.HostLink)
	MustIP(t, "link", "set", in.HostLink, "up")
	n.IP(t, "addr", "add", InternetPeerIP+"/30", "dev", "eth0")
	n.IP(t, "link", "set", "eth0", "up")
	n.IP(t, "addr", "add", InternetHTTPIP+"/32", "dev", "lo")
	// No default route: answers go back to the host end only (the node's traffic arrives
	// masqueraded to it), a packet from anywhere else has no way back.
	MustIP(t, "route", "replace", InternetCIDR, "via", InternetPeerIP, "dev", in.HostLink)
	t.Cleanup(func() { _ = exec.Command("ip", "route", "del", InternetCIDR, "via", InternetPeerIP).Run() })
	var ln net.Listener
	var err error
	n.In(t, func() { ln, err = net.Listen("tcp", in.HTTP) })
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(in.Body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return in
}
