package podnet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"socialweb.computer/internal/clusternet"
)

// NodeConfig configures a node's pod network process.
type NodeConfig struct {
	// Client is the node's own credentials (system:node:<NodeName>): the Node authorizer
	// lets it read every Node and patch its own.
	Client *rest.Config
	// NodeName is this node's Node.
	NodeName string
	// NodeIP is the node's address; its overlay endpoint is NodeIP:clusternet.OverlayPort
	// unless Endpoint is set.
	NodeIP netip.Addr
	// Endpoint is the overlay endpoint published on the Node when the host forwards one of
	// its own to the node (Host.PublishOverlay), so nodes on other hosts can be peers.
	Endpoint netip.AddrPort
	// KeyFile holds the node's overlay private key (made on first start, mode 0600).
	KeyFile string
	// OnPodCIDR is called once with the Node's spec.podCIDR when the controller-manager has
	// assigned it, before the overlay starts (the node's CNI config is written with it).
	OnPodCIDR func(netip.Prefix) error
	// Logf hears of each step.
	Logf func(format string, args ...any)
}

// RunNode runs a node's side of the pod network until ctx ends: it waits for its Node's pod
// CIDR, hands it to OnPodCIDR, starts the overlay (in this process's network namespace),
// publishes its key and endpoint on its Node, and keeps the overlay's peers those
// DesiredPeers decides from the cluster's Nodes.
func RunNode(ctx context.Context, cfg NodeConfig) error {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	clusterCIDR := netip.MustParsePrefix(clusternet.ClusterCIDR)
	nodeNetwork := netip.MustParsePrefix(clusternet.NodeNetwork)
	key, err := LoadOrCreateKey(cfg.KeyFile)
	if err != nil {
		return err
	}
	pub := key.PublicKey()
	endpoint := netip.AddrPortFrom(cfg.NodeIP, clusternet.OverlayPort).String()
	if cfg.Endpoint.IsValid() {
		endpoint = cfg.Endpoint.String()
	}
	cs, err := kubernetes.NewForConfig(cfg.Client)
	if err != nil {
		return err
	}
	f := informers.NewSharedInformerFactory(cs, 5*time.Minute)
	inf := f.Core().V1().Nodes()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, DeleteFunc: poke, UpdateFunc: func(_, n any) { poke(n) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	cfg.Logf("watching the cluster's Nodes; overlay key %s", pub)

	var ov *Overlay
	defer func() {
		if ov != nil {
			ov.Close()
		}
	}()
	var lastPeers string
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		if err := func() error {
			nodes, err := inf.Lister().List(labels.Everything())
			if err != nil {
				return err
			}
			var self *corev1.Node
			all := make([]corev1.Node, 0, len(nodes))
			for _, n := range nodes {
				all = append(all, *n)
				if n.Name == cfg.NodeName {
					self = n
				}
			}
			if self == nil {
				return nil // the kubelet has not registered it yet
			}
			own, err := podCIDRs(*self, clusterCIDR)
			if err != nil {
				return err
			}
			if len(own) == 0 {
				return nil // the controller-manager has not assigned one yet
			}
			if ov == nil {
				cfg.Logf("pod CIDR %s", own[0])
				if cfg.OnPodCIDR != nil {
					if err := cfg.OnPodCIDR(own[0]); err != nil {
						return fmt.Errorf("pod CIDR %s: %w", own[0], err)
					}
				}
				ov, err = Start(Config{PrivateKey: key, ListenPort: clusternet.OverlayPort, Address: own[0].Addr(), Logf: cfg.Logf})
				if err != nil {
					return err
				}
				cfg.Logf("overlay %s up on UDP %s", ov.Name(), endpoint)
			}
			if self.Annotations[AnnotationPublicKey] != pub.String() || self.Annotations[AnnotationEndpoint] != endpoint {
				patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
					AnnotationPublicKey: pub.String(), AnnotationEndpoint: endpoint,
				}}})
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := cs.CoreV1().Nodes().Patch(pctx, cfg.NodeName, types.MergePatchType, patch, metav1.PatchOptions{})
				cancel()
				if err != nil {
					return fmt.Errorf("publish the overlay key on Node %s: %w", cfg.NodeName, err)
				}
				cfg.Logf("published key and endpoint %s on Node %s", endpoint, cfg.NodeName)
			}
			peers, skipped := DesiredPeers(cfg.NodeName, clusterCIDR, nodeNetwork, all)
			if err := ov.SetPeers(peers); err != nil {
				return err
			}
			if s := describePeers(peers, skipped); s != lastPeers {
				lastPeers = s
				cfg.Logf("overlay peers: %s", s)
			}
			return nil
		}(); err != nil {
			cfg.Logf("error: %v (retrying)", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

func describePeers(peers []Peer, skipped []Skipped) string {
	s := strconv.Itoa(len(peers))
	for _, p := range peers {
		s += fmt.Sprintf(" %s=%s%v", p.Node, p.Endpoint, p.AllowedIPs)
	}
	for _, k := range skipped {
		s += fmt.Sprintf("; %s skipped: %s", k.Node, k.Reason)
	}
	return s
}
