package tenant

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
)

// The apiserver refuses a loopback advertise address (it becomes the endpoint of the
// kubernetes service). Tenant apiservers listen on 127.0.0.1 only and advertise an address
// of a veth pair whose other end lives in a network namespace of ours: the host end is
// AdvertiseIP, the namespace end (where nodes will attach) is AdvertisePeerIP. One pair
// serves every tenant cluster: each has its own port.
const (
	AdvertiseNetns   = "socialweb-tenants"
	AdvertiseLink    = "swt0"
	AdvertisePeer    = "swt0p"
	AdvertiseCIDR    = "10.77.0.1/24"
	AdvertisePeerIP  = "10.77.0.2/24"
	advertiseIPPlain = "10.77.0.1"
)

// AdvertiseIP is the host end of the pair.
var AdvertiseIP = net.ParseIP(advertiseIPPlain)

// ErrNoAdvertiseAddress is wrapped when the namespace and veth pair cannot be made.
var ErrNoAdvertiseAddress = errors.New("no advertise address for tenant apiservers")

// EnsureAdvertiseAddress returns AdvertiseIP, creating the network namespace and the veth
// pair when the address is not on an interface yet (idempotent). It needs root and iproute2;
// without them the error says so, and what to pass instead.
func EnsureAdvertiseAddress() (net.IP, error) {
	if hasAddress(AdvertiseIP) {
		return AdvertiseIP, nil
	}
	explain := func(why string) error {
		return fmt.Errorf("%w: %s; tenant apiservers need a non-loopback address: run as root with iproute2 installed "+
			"(socialweb creates network namespace %s with a veth pair, host end %s), or pass --tenant-advertise-address "+
			"with an address this host already has", ErrNoAdvertiseAddress, why, AdvertiseNetns, AdvertiseCIDR)
	}
	if os.Geteuid() != 0 {
		return nil, explain("not running as root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		return nil, explain("the ip command (iproute2) is not installed")
	}
	run := func(args ...string) error {
		out, err := exec.Command(ip, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	// Another process of this binary may be making the same pair at the same moment: a
	// failed add is fine when what it was to add is there afterwards.
	netnsThere := func() bool { _, err := os.Stat("/run/netns/" + AdvertiseNetns); return err == nil }
	linkThere := func() bool { _, err := net.InterfaceByName(AdvertiseLink); return err == nil }
	if !netnsThere() {
		if err := run("netns", "add", AdvertiseNetns); err != nil && !netnsThere() {
			return nil, explain(err.Error())
		}
	}
	if !linkThere() {
		if err := run("link", "add", AdvertiseLink, "type", "veth", "peer", "name", AdvertisePeer, "netns", AdvertiseNetns); err != nil && !linkThere() {
			return nil, explain(err.Error())
		}
	}
	steps := [][]string{
		{"addr", "replace", AdvertiseCIDR, "dev", AdvertiseLink},
		{"link", "set", AdvertiseLink, "up"},
		{"-n", AdvertiseNetns, "addr", "replace", AdvertisePeerIP, "dev", AdvertisePeer},
		{"-n", AdvertiseNetns, "link", "set", AdvertisePeer, "up"},
		{"-n", AdvertiseNetns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return nil, explain(err.Error())
		}
	}
	if !hasAddress(AdvertiseIP) {
		return nil, explain("the veth pair was made but " + advertiseIPPlain + " is not on it")
	}
	return AdvertiseIP, nil
}

// CheckAdvertiseAddress accepts an address given by the operator: non-loopback and on an
// interface of this host.
func CheckAdvertiseAddress(s string) (net.IP, error) {
	ip := net.ParseIP(s)
	if ip == nil {
		return nil, fmt.Errorf("--tenant-advertise-address %q is not an IP address", s)
	}
	if ip.IsLoopback() || ip.IsUnspecified() {
		return nil, fmt.Errorf("--tenant-advertise-address %s: the apiserver refuses loopback and unspecified addresses", s)
	}
	if !hasAddress(ip) {
		return nil, fmt.Errorf("--tenant-advertise-address %s is not an address of this host", s)
	}
	return ip, nil
}

func hasAddress(ip net.IP) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
