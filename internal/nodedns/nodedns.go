// Package nodedns is the DNS server of every tenant-cluster node: CoreDNS built in as a
// library (its kubernetes, forward, cache, errors and bind plugins, nothing else),
// answering inside the node on clusternet.NodeLocalDNS for the cluster's domain from the
// cluster's Services and EndpointSlices, and forwarding every other name to the upstream the
// bidder's operator configured. The node agent writes the Corefile (Corefile) and starts
// `socialweb node-dns COREFILE` inside the node's namespaces, with the node's own
// credentials.
package nodedns

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"

	"socialweb.computer/internal/clusternet"

	// The plugins a node's Corefile uses: each registers its directive.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// Config is what a node's Corefile says.
type Config struct {
	// Listen is the address the server answers on (clusternet.NodeLocalDNS), UDP and TCP
	// port 53.
	Listen string
	// Domain is the cluster's DNS domain (clusternet.ClusterDomain).
	Domain string
	// Kubeconfig is the node's own credentials for the cluster's apiserver.
	Kubeconfig string
	// Upstreams (IP:port) get every name outside the cluster's domain and its reverse zones;
	// none: those names are answered SERVFAIL.
	Upstreams []string
}

// Corefile is the CoreDNS configuration of c. The kubernetes plugin answers the cluster's
// domain and the reverse zones (falling through to the upstream for reverse names it does
// not hold); with no upstream nothing follows it, so a name outside the cluster is SERVFAIL
// (CoreDNS's answer when no plugin is left) rather than a silent NXDOMAIN.
func Corefile(c Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, ".:53 {\n    bind %s\n    errors\n    cache 30\n", c.Listen)
	fmt.Fprintf(&b, "    kubernetes %s in-addr.arpa ip6.arpa {\n", c.Domain)
	fmt.Fprintf(&b, "        kubeconfig %s\n", c.Kubeconfig)
	b.WriteString("        pods insecure\n        ttl 30\n")
	if len(c.Upstreams) > 0 {
		b.WriteString("        fallthrough in-addr.arpa ip6.arpa\n")
	}
	b.WriteString("    }\n")
	if len(c.Upstreams) > 0 {
		// No loop plugin: it probes with a query of a random name through the upstream at
		// every start. ChooseUpstreams refuses the upstreams that would loop instead.
		fmt.Fprintf(&b, "    forward . %s\n", strings.Join(c.Upstreams, " "))
	}
	b.WriteString("}\n")
	return b.String()
}

// ErrUpstream says the operator's upstream setting is not an address list.
var ErrUpstream = errors.New("invalid DNS upstream")

// UpstreamNone is the operator's setting for no upstream: names outside the cluster fail.
const UpstreamNone = "none"

// ChooseUpstreams decides where a node forwards names outside the cluster. setting is the
// operator's flag: a comma-separated list of IP or IP:port (literal addresses only: nothing
// here is ever resolved), UpstreamNone, or empty for the host's own choice, the first
// nameserver of resolvConf that is not a loopback address (a loopback address inside a node
// is the node's own, not the host's resolver). why says how the choice was made, for the
// agent's log.
func ChooseUpstreams(setting string, resolvConf []byte) (upstreams []string, why string, err error) {
	setting = strings.TrimSpace(setting)
	switch setting {
	case UpstreamNone:
		return nil, "the operator set none: names outside the cluster answer SERVFAIL", nil
	case "":
		for _, ns := range nameservers(resolvConf) {
			a, err := netip.ParseAddr(ns)
			if err != nil || a.IsLoopback() || a.IsUnspecified() {
				continue
			}
			return []string{netip.AddrPortFrom(a.Unmap(), 53).String()}, "the host's resolv.conf", nil
		}
		return nil, "no upstream: the host's resolv.conf names no nameserver outside loopback, so names outside the cluster answer SERVFAIL (set the bidder's --node-dns-upstream)", nil
	}
	for _, f := range strings.Split(setting, ",") {
		f = strings.TrimSpace(f)
		if ap, err := netip.ParseAddrPort(f); err == nil {
			if ap.Port() == 0 {
				return nil, "", fmt.Errorf("%w %q: port 0", ErrUpstream, f)
			}
			upstreams = append(upstreams, ap.String())
			continue
		}
		a, err := netip.ParseAddr(f)
		if err != nil {
			return nil, "", fmt.Errorf("%w %q: want IP or IP:port (a name would need a resolver), or %q", ErrUpstream, f, UpstreamNone)
		}
		upstreams = append(upstreams, netip.AddrPortFrom(a, 53).String())
	}
	for _, u := range upstreams {
		ap := netip.MustParseAddrPort(u)
		// Inside a node a loopback address is the node's own, and NodeLocalDNS the server
		// itself: either makes queries circle.
		if a := ap.Addr(); a.IsLoopback() || a.IsUnspecified() || a.String() == clusternet.NodeLocalDNS {
			return nil, "", fmt.Errorf("%w %q: a loopback, unspecified or the node-local DNS address is the node itself", ErrUpstream, u)
		}
	}
	return upstreams, "the operator's setting", nil
}

// nameservers lists the nameserver lines of a resolv.conf in order.
func nameservers(resolvConf []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(resolvConf))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			// A zone index (fe80::1%eth0) names an interface of the host, not the node.
			out = append(out, strings.SplitN(f[1], "%", 2)[0])
		}
	}
	return out
}

// Run serves the Corefile at path until SIGTERM or SIGINT.
func Run(path string) error {
	body, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	caddy.Quiet, dnsserver.Quiet = true, true
	caddy.AppName = "socialweb node-dns"
	inst, err := caddy.Start(caddy.CaddyfileInput{Contents: body, Filepath: path, ServerTypeName: "dns"})
	if err != nil {
		return fmt.Errorf("node-dns: %w", err)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		_ = inst.Stop()
	}()
	inst.Wait()
	return nil
}
