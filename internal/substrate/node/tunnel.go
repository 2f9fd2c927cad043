package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"time"

	"socialweb.computer/internal/clusternet"
	"socialweb.computer/internal/tenant/tunnel"
)

// kubeletPort is the kubelet's API port (its default; kubeletConfig does not change it).
const kubeletPort = 10250

// startTunnel holds the node's tunnel to its cluster's gate open (internal/tenant/tunnel):
// the apiserver reaches the node's kubelet, its pods and the cluster's Services only
// through it, and the agent dials each from inside the node (its network namespace, or the
// guest of a vm node), where the node's egress rules apply as they do to its pods. It
// authenticates with the node's current client certificate (re-read at each connect) and
// dials nothing but the cluster's pod and Service networks and its own kubelet.
func (a *agent) startTunnel() error {
	ns := a.ns
	u, err := url.Parse(ns.Server)
	if err != nil {
		return err
	}
	ca, err := os.ReadFile(ns.secret(SecretCA))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in the cluster CA %s", ns.secret(SecretCA))
	}
	nodeIP, err := netip.ParseAddr(ns.NodeIP)
	if err != nil {
		return fmt.Errorf("node IP %q: %w", ns.NodeIP, err)
	}
	dial := (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	if ns.Netns != "" {
		path := ns.netnsPath()
		dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns(ctx, path, network, addr)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.stopTunnel = cancel
	c := &tunnel.Client{
		// The agent reaches the gate where the node's kubeconfig names it: on the host for a
		// namespace node, through the guest's own forward for a vm node.
		Gate: u.Host,
		TLS: &tls.Config{
			RootCAs:    pool,
			ServerName: u.Hostname(),
			MinVersion: tls.VersionTLS12,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				pair, err := a.clientPair()
				if err != nil {
					return nil, err
				}
				c, err := tls.X509KeyPair(pair, pair)
				return &c, err
			},
		},
		Allow: tunnel.AllowInCluster(tunnel.Ranges{
			Pods:     netip.MustParsePrefix(clusternet.ClusterCIDR),
			Services: netip.MustParsePrefix(clusternet.ServiceCIDR),
		}, nodeIP, kubeletPort),
		Dial: dial,
		Logf: a.logf,
	}
	go c.Run(ctx)
	return nil
}
