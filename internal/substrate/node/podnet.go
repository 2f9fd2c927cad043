package node

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/podnet"
	"socialweb.computer/internal/substrate/guestproc"
)

// overlayKeyFile, in the guest dir, is the node's overlay private key (mode 0600): the
// node's identity in its cluster's overlay, gone with the node.
const overlayKeyFile = "overlay.key"

// RunPodNet is a node's pod network process (`socialweb node-podnet DIR`, started by the
// agent inside the node's namespaces): with the node's own credentials it waits for the
// Node's spec.podCIDR, writes the CNI config with it, and runs the overlay (podnet.RunNode)
// until SIGTERM. It returns the exit status.
func RunPodNet(dir string) int {
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s node-podnet: %s\n", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
	var ns nodeState
	if err := guestproc.ReadJSON(filepath.Join(dir, nodeFile), &ns); err != nil {
		logf("error: %v", err)
		return 2
	}
	nodeIP, err := netip.ParseAddr(ns.NodeIP)
	if err != nil {
		logf("error: node IP %q: %v", ns.NodeIP, err)
		return 2
	}
	var endpoint netip.AddrPort
	if ns.OverlayEndpoint != "" {
		if endpoint, err = netip.ParseAddrPort(ns.OverlayEndpoint); err != nil {
			logf("error: overlay endpoint %q: %v", ns.OverlayEndpoint, err)
			return 2
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", ns.secret(SecretKubeconfig))
	if err != nil {
		logf("error: the node's kubeconfig: %v", err)
		return 2
	}
	// The join bundle's certificate lives a day; the kubelet renews it into its cert dir.
	// This process reads its pair from a file client-go reloads: the bundle's pair at first,
	// the kubelet's current one once there is one.
	pair := ns.work("podnet-client.pem")
	if len(cfg.CertData) == 0 || len(cfg.KeyData) == 0 {
		logf("error: the node's kubeconfig holds no client certificate and key")
		return 2
	}
	if err := os.WriteFile(pair, append(append([]byte(nil), cfg.CertData...), cfg.KeyData...), 0o600); err != nil {
		logf("error: %v", err)
		return 1
	}
	cfg.CertData, cfg.KeyData = nil, nil
	cfg.CertFile, cfg.KeyFile = pair, pair
	cfg.UserAgent = "socialweb-node-podnet"
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go followKubeletPair(ctx, ns.work("kubelet", "pki", "kubelet-client-current.pem"), pair, logf)
	err = podnet.RunNode(ctx, podnet.NodeConfig{
		Client: cfg, NodeName: ns.NodeName, NodeIP: nodeIP, Endpoint: endpoint,
		KeyFile: filepath.Join(ns.Dir, overlayKeyFile),
		OnPodCIDR: func(p netip.Prefix) error {
			if err := writeCNIConfig(ns, p.String()); err != nil {
				return err
			}
			logf("CNI config written for pod subnet %s", p)
			return nil
		},
		Logf: logf,
	})
	if err != nil {
		logf("error: %v", err)
		return 1
	}
	logf("stopped")
	return 0
}

// followKubeletPair makes pair a link to the kubelet's current client pair once it exists
// (checked every 30 s), so a renewed certificate is the pod network's too.
func followKubeletPair(ctx context.Context, current, pair string, logf func(string, ...any)) {
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		if _, err := os.Stat(current); err == nil {
			if target, _ := os.Readlink(pair); target != current {
				tmp := pair + ".tmp"
				_ = os.Remove(tmp)
				if err := os.Symlink(current, tmp); err == nil && os.Rename(tmp, pair) == nil {
					logf("client certificate: the kubelet's current pair")
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
