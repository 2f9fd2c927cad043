package tenant

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/tenant/tunnel"
	"socialweb.computer/internal/unixsock"
)

// The apiserver's connections into its cluster (webhooks, aggregated APIs, the pod and
// Service proxy, the kubelets) go through the cluster's node tunnels (package tunnel): its
// egress selector sends them as HTTP CONNECT over a unix socket in the cluster's directory,
// which the manager serves. The child runs in that directory, so the configuration names
// the socket by a relative path: a data dir deep enough would make the absolute one longer
// than a socket address may be.
const egressSocketName = "egress.sock"

// EgressSocket is the socket the manager answers the apiserver's egress selector on.
func (l Layout) EgressSocket() string { return filepath.Join(l.Dir, egressSocketName) }

// EgressSelectorConfig is the apiserver's egress selector configuration.
func (l Layout) EgressSelectorConfig() string { return filepath.Join(l.Dir, "egress-selector.yaml") }

// egressSelectorConfig: "cluster" (Service-referenced webhooks, aggregated APIs, the
// proxy, the kubelets) and "controlplane" (webhooks given by URL; the authentication and
// authorization webhooks and OIDC issuers a tenant apiserver never has) both through the
// tunnels. "etcd" is left out and keeps the default dialing: a Direct etcd selection dials
// TCP, and the apiserver's etcd is a unix socket.
const egressSelectorConfig = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + egressSocketName + `
- name: controlplane
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: ` + egressSocketName + `
`

func writeEgressSelectorConfig(l Layout) error {
	return atomicfile.Write(l.EgressSelectorConfig(), []byte(egressSelectorConfig), 0o600)
}

// clusterRanges are every tenant cluster's pod and Service networks.
var clusterRanges = tunnel.Ranges{
	Pods:     netip.MustParsePrefix(clusternet.ClusterCIDR),
	Services: netip.MustParsePrefix(clusternet.ServiceCIDR),
}

// egress is one cluster's tunnel server and the apiserver's socket to it.
type egress struct {
	srv *tunnel.Server
	ln  net.Listener
}

// startEgress serves the cluster's node tunnels on its gate and the apiserver's egress
// socket. The Nodes routing needs are listed through the admin client, at most every 2 s
// (and again on a miss).
func (m *Manager) startEgress(in *instance, serving tls.Certificate) (*egress, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(in.pki.CAPEM) {
		return nil, fmt.Errorf("cluster %s: no CA certificate to verify nodes with", in.key)
	}
	lister := &nodeLister{m: m, key: in.key}
	srv := tunnel.NewServer(clusterRanges, lister.list, in.revokedNodes.Revoked, m.cfg.Logger.With("cluster", in.key.String()))
	in.gate.SetTunnel(tunnel.ALPN, &tls.Config{
		Certificates: []tls.Certificate{serving},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, srv)
	ln, err := listenUnix(in.layout.EgressSocket())
	if err != nil {
		return nil, fmt.Errorf("cluster %s: egress socket: %w", in.key, err)
	}
	go func() { _ = srv.ServeConnect(ln) }()
	return &egress{srv: srv, ln: ln}, nil
}

func (e *egress) close() {
	if e != nil {
		e.ln.Close()
	}
}

// listenUnix listens on a socket at path, replacing a stale one, readable by root only. A
// path longer than a socket address holds is bound through its directory's descriptor.
func listenUnix(path string) (net.Listener, error) {
	_ = os.Remove(path)
	bind, release, err := unixsock.Short(path)
	if err != nil {
		return nil, err
	}
	defer release()
	ln, err := net.Listen("unix", bind)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// nodeLister lists a cluster's Nodes for routing, cached for 2 s.
type nodeLister struct {
	m   *Manager
	key Key

	mu    sync.Mutex
	cs    kubernetes.Interface // made once: one transport, its connections reused
	at    time.Time
	nodes []tunnel.Node
}

func (l *nodeLister) list(ctx context.Context, fresh bool) ([]tunnel.Node, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.at.IsZero() && time.Since(l.at) < 2*time.Second && (!fresh || time.Since(l.at) < 200*time.Millisecond) {
		return l.nodes, nil
	}
	if l.cs == nil {
		cfg, err := l.m.AdminConfig(l.key)
		if err != nil {
			return nil, err
		}
		if l.cs, err = kubernetes.NewForConfig(cfg); err != nil {
			return nil, err
		}
	}
	list, err := l.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	nodes := make([]tunnel.Node, 0, len(list.Items))
	for _, n := range list.Items {
		tn := tunnel.Node{Name: n.Name}
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				tn.PodCIDRs = append(tn.PodCIDRs, p)
			}
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				tn.Addresses = append(tn.Addresses, ip)
			}
		}
		nodes = append(nodes, tn)
	}
	l.nodes, l.at = nodes, time.Now()
	return nodes, nil
}
