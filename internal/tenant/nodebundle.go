package tenant

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeBundleTTL is how long a node's join credentials are valid. A guest that has not
// joined by then gets a new bundle when its claim is composed again; certificate rotation
// of a joined kubelet comes with the node guest.
const NodeBundleTTL = 24 * time.Hour

// Keys of a join bundle Secret. They are the names of the secrets a node guest is handed
// (the market delivers every key of the Secret, and a secret's name takes no dots): the
// node substrate reads "kubeconfig" and "ca".
const (
	BundleKeyServer     = "server"
	BundleKeyCA         = "ca"
	BundleKeyKubeconfig = "kubeconfig"
	BundleKeyNotAfter   = "notAfter"
)

// ErrNoCA says the cluster has no certificate authority yet (it never started): no bundle
// can be minted until it has.
var ErrNoCA = errors.New("tenant cluster has no certificate authority yet")

// NodeBundle is what a guest needs to join a tenant cluster as node NodeName: the server to
// dial, the cluster CA and a kubelet kubeconfig with a client certificate for
// system:node:<name> in group system:nodes (what the Node authorizer and NodeRestriction
// expect).
type NodeBundle struct {
	Server     string
	CAPEM      []byte
	Kubeconfig []byte
	NotAfter   time.Time
}

// Data is the bundle as the data of a Secret.
func (b NodeBundle) Data() map[string][]byte {
	return map[string][]byte{
		BundleKeyServer:     []byte(b.Server),
		BundleKeyCA:         b.CAPEM,
		BundleKeyKubeconfig: b.Kubeconfig,
		BundleKeyNotAfter:   []byte(b.NotAfter.UTC().Format(time.RFC3339)),
	}
}

// MintNodeBundle mints the join bundle of nodeName from the CA of the cluster k kept under
// root, for server. An error wraps ErrNoCA when the cluster never started, ErrNodeRevoked
// when the name was released in it.
func MintNodeBundle(root string, k Key, nodeName, server string, ttl time.Duration) (NodeBundle, error) {
	if ttl == 0 {
		ttl = NodeBundleTTL
	}
	l := LayoutFor(root, k.Namespace, k.Name)
	if _, err := os.Stat(l.PKI()); err != nil {
		return NodeBundle{}, fmt.Errorf("cluster %s: %w: %v", k, ErrNoCA, err)
	}
	p, err := loadPKI(l.PKI())
	if err != nil {
		return NodeBundle{}, fmt.Errorf("cluster %s: %w: %v", k, ErrNoCA, err)
	}
	revoked, err := LoadRevokedNodes(l.RevokedNodes())
	if err != nil {
		return NodeBundle{}, fmt.Errorf("cluster %s: reading its revoked nodes: %w", k, err)
	}
	if revoked.Has(nodeName) {
		return NodeBundle{}, fmt.Errorf("cluster %s, node %s: %w", k, nodeName, ErrNodeRevoked)
	}
	crt, key, notAfter, err := p.IssueClient("system:node:"+nodeName, []string{"system:nodes"}, ttl)
	if err != nil {
		return NodeBundle{}, err
	}
	kc, err := kubeconfig(k.Name, server, p.CAPEM, crt, key)
	if err != nil {
		return NodeBundle{}, err
	}
	return NodeBundle{Server: server, CAPEM: p.CAPEM, Kubeconfig: kc, NotAfter: notAfter}, nil
}

// MintNodeBundle mints a join bundle for a cluster this manager runs; the server is the
// cluster's gate: on Config.PublicAddress when one is set, so that a node bidder on any host
// can join, else on loopback.
func (m *Manager) MintNodeBundle(k Key, nodeName string) (NodeBundle, error) {
	s := m.Status(k)
	if s.Server == "" {
		return NodeBundle{}, fmt.Errorf("cluster %s: %w: it is not running here", k, ErrNoCA)
	}
	return MintNodeBundle(m.cfg.Root, k, nodeName, m.nodeServer(s.Server), 0)
}

// nodeServer is the server nodes join at for a gate at server (https://127.0.0.1:PORT):
// the same port on Config.PublicAddress when one is set.
func (m *Manager) nodeServer(server string) string {
	if m.cfg.PublicAddress == nil {
		return server
	}
	u, err := url.Parse(server)
	if err != nil {
		return server
	}
	u.Host = net.JoinHostPort(m.cfg.PublicAddress.String(), u.Port())
	return u.String()
}

// NodeReady reports whether node name is registered in cluster k with condition Ready True.
func (m *Manager) NodeReady(ctx context.Context, k Key, name string) (bool, error) {
	cfg, err := m.AdminConfig(k)
	if err != nil {
		return false, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return false, err
	}
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue, nil
		}
	}
	return false, nil
}

// RevokeNode revokes every credential of node name in cluster k (noderevocation.go): the name
// is in the cluster's revoked nodes when this returns, so the apiserver refuses the node's
// next request and the gate its next tunnel, and its open tunnels are closed. It holds after
// a restart (the file is the state). A cluster with no directory here holds no credentials.
func (m *Manager) RevokeNode(k Key, name string) error {
	l := m.Layout(k)
	if _, err := os.Stat(l.Dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	m.revokeNodesMu.Lock()
	set, err := LoadRevokedNodes(l.RevokedNodes())
	if err == nil {
		var changed bool
		if set, changed = set.With(name, time.Now()); changed {
			err = saveRevokedNodes(l.RevokedNodes(), set)
		}
	}
	m.revokeNodesMu.Unlock()
	if err != nil {
		return fmt.Errorf("cluster %s: revoking node %s: %w", k, name, err)
	}
	if in := m.get(k); in != nil && in.egress != nil {
		if n := in.egress.srv.Disconnect(name); n > 0 {
			m.cfg.Logger.Info("tenant_node_tunnels_closed", "cluster", k.String(), "node", name, "tunnels", n)
		}
	}
	return nil
}

// DeleteNode deletes node name's object from cluster k, and then the pods still bound to it;
// a node already gone is no error. It is called once the node's guest is gone, so those pods
// run nowhere: deleted now, their controllers recreate them elsewhere at once, where the pod
// garbage collector would wait 40 s (its quarantine of pods on a missing node) first.
func (m *Manager) DeleteNode(ctx context.Context, k Key, name string) error {
	cfg, err := m.AdminConfig(k)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return DeleteNodeAndPods(ctx, cs, name)
}

// DeleteNodeAndPods deletes node name's object through cs, then the pods still bound to it
// (see Manager.DeleteNode); a node already gone is no error.
func DeleteNodeAndPods(ctx context.Context, cs kubernetes.Interface, name string) error {
	if err := cs.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return deletePodsOn(ctx, cs, name)
}

// deletePodsOn deletes, without a grace period, the pods bound to node name.
func deletePodsOn(ctx context.Context, cs kubernetes.Interface, name string) error {
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return fmt.Errorf("pods on node %s: %w", name, err)
	}
	zero := int64(0)
	for _, p := range pods.Items {
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: &metav1.Preconditions{UID: &p.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("pod %s/%s on node %s: %w", p.Namespace, p.Name, name, err)
		}
	}
	return nil
}
