package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"golang.org/x/sys/unix"
)

// The images are served from a network namespace that stands for the internet: the host
// reaches it through a veth pair and one host route, as nodes' egress reaches any public
// address. Its addresses are from TEST-NET-2 (198.51.100.0/24, RFC 5737), which no real host
// holds: 198.51.100.8/30 for the link and 198.51.100.20 for the registry, apart from the
// 198.51.100.0/30 and 198.51.100.64/26 the tests' internet namespace uses, so a run and the
// tests can share a host. (TEST-NET-1 is this machine's own network here.)
const (
	internetNetns = "swconf-inet"
	internetLink  = "swconfi0" // the host's end
	hostIP        = "198.51.100.9"
	peerIP        = "198.51.100.10"
	registryIP    = "198.51.100.20"
	registryAddr  = registryIP + ":5000"
)

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeInternet deletes the namespace, the host's end of its link and the route (a
// previous run's leftovers too); absent parts are not an error.
func removeInternet() {
	_ = exec.Command("ip", "route", "del", registryIP+"/32").Run()
	_ = exec.Command("ip", "route", "del", "unreachable", registryIP+"/32").Run()
	_ = exec.Command("ip", "link", "del", internetLink).Run()
	_ = exec.Command("ip", "netns", "del", internetNetns).Run()
}

// clashes says which of ours lie in a network the host is on (an address of one of its
// interfaces with its prefix): a documentation range can be a lab's own LAN, and taking its
// gateway's address would cut the host off.
func clashes(hostNets []netip.Prefix, ours []netip.Addr) []string {
	var out []string
	for _, a := range ours {
		for _, n := range hostNets {
			if n.Contains(a) {
				out = append(out, fmt.Sprintf("%s is in the host's network %s", a, n))
			}
		}
	}
	return out
}

// hostNetworks are the networks of the host's interfaces, ours excepted.
func hostNetworks() ([]netip.Prefix, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, i := range ifs {
		if i.Name == internetLink {
			continue
		}
		addrs, err := i.Addrs()
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out, nil
}

// makeInternet creates the namespace, its link and the host route to registryIP.
func makeInternet() error {
	removeInternet()
	nets, err := hostNetworks()
	if err != nil {
		return err
	}
	ours := []netip.Addr{netip.MustParseAddr(hostIP), netip.MustParseAddr(peerIP), netip.MustParseAddr(registryIP)}
	if c := clashes(nets, ours); len(c) > 0 {
		return fmt.Errorf("the internet namespace's addresses clash with this host's: %s", strings.Join(c, "; "))
	}
	for _, args := range [][]string{
		{"netns", "add", internetNetns},
		{"-n", internetNetns, "link", "set", "lo", "up"},
		{"link", "add", internetLink, "type", "veth", "peer", "name", "eth0", "netns", internetNetns},
		{"addr", "add", hostIP + "/30", "dev", internetLink},
		{"link", "set", internetLink, "up"},
		{"-n", internetNetns, "addr", "add", peerIP + "/30", "dev", "eth0"},
		{"-n", internetNetns, "link", "set", "eth0", "up"},
		{"-n", internetNetns, "addr", "add", registryIP + "/32", "dev", "lo"},
		// No default route in the namespace: answers go back to the host's end only (nodes'
		// traffic arrives masqueraded to it).
		{"route", "replace", registryIP + "/32", "via", peerIP, "dev", internetLink},
	} {
		if err := ipCmd(args...); err != nil {
			removeInternet()
			return err
		}
	}
	return nil
}

// listenIn opens a TCP listener inside the namespace: a locked thread enters it, opens the
// socket (which stays in the namespace) and the thread is retired.
func listenIn(netns, addr string) (net.Listener, error) {
	type result struct {
		ln  net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		f, err := os.Open("/run/netns/" + netns)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("setns %s: %w", netns, err)}
			return
		}
		ln, err := net.Listen("tcp", addr)
		done <- result{ln, err}
	}()
	r := <-done
	return r.ln, r.err
}

// serveRegistry serves go-containerregistry's in-memory registry at registryAddr inside the
// namespace.
func serveRegistry() (*http.Server, error) {
	ln, err := listenIn(internetNetns, registryAddr)
	if err != nil {
		return nil, fmt.Errorf("registry listener in %s: %w", internetNetns, err)
	}
	srv := &http.Server{Handler: registry.New(registry.Logger(log.New(ioDiscard{}, "", 0))), ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

type ioDiscard struct{}

func (ioDiscard) Write(b []byte) (int, error) { return len(b), nil }

// directTransport dials the address itself: no proxy from the environment (the registry is
// an address literal, so nothing is resolved for it; the busybox source's host is).
func directTransport() http.RoundTripper {
	return &http.Transport{
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
}

// push writes every reference to the registry.
func push(ctx context.Context, refs map[name.Reference]v1.Image) error {
	for r, img := range refs {
		if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithTransport(directTransport())); err != nil {
			return fmt.Errorf("push %s: %w", r, err)
		}
	}
	return nil
}
