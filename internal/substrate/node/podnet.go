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
	cfg, err := clientcmd.BuildConfigFromFlags("", ns.secret(SecretKubeconfig))
	if err != nil {
		logf("error: the node's kubeconfig: %v", err)
		return 2
	}
	// The kubelet renews the join bundle's day-long certificate into its cert dir; its
	// current pair, once there, is this process's too.
	if cur := ns.work("kubelet", "pki", "kubelet-client-current.pem"); fileExists(cur) {
		cfg.CertData, cfg.KeyData = nil, nil
		cfg.CertFile, cfg.KeyFile = cur, cur
	}
	cfg.UserAgent = "socialweb-node-podnet"
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = podnet.RunNode(ctx, podnet.NodeConfig{
		Client: cfg, NodeName: ns.NodeName, NodeIP: nodeIP,
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

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
