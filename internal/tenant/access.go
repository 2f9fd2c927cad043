package tenant

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"socialweb.computer/internal/certs"
	"socialweb.computer/internal/tenant/gate"
)

// DefaultNamespaces are the namespaces a Ready cluster lists.
var DefaultNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease"}

// AdminConfig is a rest.Config straight to the cluster's apiserver (not through the gate) as
// the Cluster controller's system:masters identity.
func (m *Manager) AdminConfig(k Key) (*rest.Config, error) {
	in := m.get(k)
	if in == nil {
		return nil, fmt.Errorf("cluster %s is not managed here", k)
	}
	return &rest.Config{
		Host: fmt.Sprintf("https://127.0.0.1:%d", in.ports.APIServer),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   in.pki.CAPEM,
			CertFile: in.pki.Cert("admin"),
			KeyFile:  in.pki.Key("admin"),
		},
		QPS: 50, Burst: 100, Timeout: 10 * time.Second,
		// Tracked, so that stopping the control plane closes them (manager.go).
		Dial: in.direct.dial,
	}, nil
}

// awaitReady marks the cluster Ready once /readyz answers 200, the default namespaces list
// and the default ServiceAccount exists (a pod can be created), polling every 25 ms.
func (m *Manager) awaitReady(ctx context.Context, in *instance, pid int) {
	cfg, err := m.AdminConfig(in.key)
	if err != nil {
		return
	}
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return
	}
	for ctx.Err() == nil {
		if ready(ctx, cs) {
			in.mu.Lock()
			current := in.status.PID == pid
			if current {
				in.status.State = StateReady
				in.status.ReadyAt = time.Now()
				if !in.asleep && in.gate.Mode() == gate.Asleep {
					// Woken: the held clients go through now.
					in.gate.Set(gate.Serving, "")
				}
			}
			in.mu.Unlock()
			m.notify(in.key)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
	}
}

func ready(ctx context.Context, cs kubernetes.Interface) bool {
	var code int
	cs.Discovery().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&code)
	if code != 200 {
		return false
	}
	ns, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	have := map[string]bool{}
	for _, n := range ns.Items {
		have[n.Name] = true
	}
	for _, want := range DefaultNamespaces {
		if !have[want] {
			return false
		}
	}
	// The default ServiceAccount: until the controller-manager has made it, every pod
	// created in the default namespace is refused.
	_, err = cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
	return err == nil
}

// OwnerNamespace holds the per-account ServiceAccount in every tenant cluster.
const OwnerNamespace = "socialweb-system"

// OwnerServiceAccount is the name of the ServiceAccount that acts for account in its
// cluster: a stable function of the DID (a DID is not a valid object name).
func OwnerServiceAccount(account string) string {
	h := sha256.Sum256([]byte(account))
	return "account-" + hex.EncodeToString(h[:])[:16]
}

// OwnerBinding is the ClusterRoleBinding of cluster-admin to the owner (its DID as a user
// and its ServiceAccount).
const OwnerBinding = "socialweb:owner"

// APIServerKubeletClientUser is the user of the apiserver's client certificate towards
// kubelets (pki.go).
const APIServerKubeletClientUser = "kube-apiserver-kubelet-client"

// PodNetNodeReader names the ClusterRole (and its binding to every node) that lets a node
// read the cluster's Nodes, for its pod network's overlay peers.
const PodNetNodeReader = "socialweb:podnet-node-reader"

// Bootstrap makes the owner an administrator of their cluster: a ClusterRoleBinding of
// cluster-admin to the user named by the DID (the identity of minted kubeconfigs), and a
// ServiceAccount for the account, bound likewise, for applies made on the owner's behalf.
// It also binds system:kubelet-api-admin to the apiserver's kubelet client, so logs and
// exec reach the nodes, and gives nodes what their kube-proxy and DNS server read
// (nodeServicesAccess). Idempotent.
//
// revoked are the identities the Cluster denies (spec.members Revoked): their ServiceAccount
// and bindings are removed (RevokeIdentity) and, for a revoked owner, not made again, so a
// revocation made while the cluster was stopped holds from its next start.
func (m *Manager) Bootstrap(ctx context.Context, k Key, account string, revoked []string) error {
	cfg, err := m.AdminConfig(k)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ownerRevoked := false
	for _, did := range revoked {
		if did == account {
			ownerRevoked = true
		}
		made, err := AttributionFor(m.Layout(k), did)
		if err != nil {
			return fmt.Errorf("bootstrapping cluster %s: %w", k, err)
		}
		if _, err := RevokeIdentity(ctx, cs, did, made); err != nil {
			return fmt.Errorf("bootstrapping cluster %s: %w", k, err)
		}
	}
	sa := OwnerServiceAccount(account)
	objs := []func() error{
		func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: OwnerNamespace}}, metav1.CreateOptions{})
			return err
		},
	}
	if !ownerRevoked {
		objs = append(objs, func() error {
			_, err := cs.CoreV1().ServiceAccounts(OwnerNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
				Name: sa, Annotations: map[string]string{"socialweb.computer/account": account},
			}}, metav1.CreateOptions{})
			return err
		}, func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: OwnerBinding, Annotations: map[string]string{"socialweb.computer/account": account}},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects: []rbacv1.Subject{
					{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: account},
					{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: OwnerNamespace},
				},
			}, metav1.CreateOptions{})
			return err
		})
	}
	// The apiserver's identity towards kubelets may use the kubelet API (logs, exec,
	// port-forward): kubelets authorize it through the cluster (webhook mode).
	objs = append(objs, func() error {
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "socialweb:apiserver-kubelet-client"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:kubelet-api-admin"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: APIServerKubeletClientUser}},
		}, metav1.CreateOptions{})
		return err
	})
	// Every node reads the cluster's Nodes: its pod network makes each other Node a peer
	// of its overlay (their pod CIDRs, keys and endpoints). The Node authorizer alone lets
	// a node read only its own Node.
	objs = append(objs, func() error {
		_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: PodNetNodeReader},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}},
		}, metav1.CreateOptions{})
		return err
	}, func() error {
		_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: PodNetNodeReader},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: PodNetNodeReader},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"}},
		}, metav1.CreateOptions{})
		return err
	})
	objs = append(objs, nodeServicesAccess(ctx, cs)...)
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bootstrapping cluster %s: %w", k, err)
		}
	}
	return nil
}

// Names of the access every node's kube-proxy and DNS server have, with the node's own
// credentials (group system:nodes), as k3s gives its agents.
const (
	NodeProxierBinding = "socialweb:node-proxier"
	NodeDNSRole        = "socialweb:node-dns"
)

// nodeServicesAccess makes what kube-proxy and the DNS server of a node read: the upstream
// ClusterRole system:node-proxier (Services, EndpointSlices, Nodes; events) and list and
// watch of Namespaces (CoreDNS's kubernetes plugin follows them), bound to system:nodes.
func nodeServicesAccess(ctx context.Context, cs kubernetes.Interface) []func() error {
	nodes := []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"}}
	return []func() error{
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: NodeProxierBinding},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
				Subjects:   nodes,
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: NodeDNSRole},
				Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list", "watch"}}},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: NodeDNSRole},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: NodeDNSRole},
				Subjects:   nodes,
			}, metav1.CreateOptions{})
			return err
		},
	}
}

// OnBehalfOf is a rest.Config that acts in the cluster as the account's ServiceAccount (the
// controller's identity impersonating it): what is applied for the owner is subject to the
// RBAC the owner's ServiceAccount has.
func (m *Manager) OnBehalfOf(k Key, account string) (*rest.Config, error) {
	cfg, err := m.AdminConfig(k)
	if err != nil {
		return nil, err
	}
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + OwnerNamespace + ":" + OwnerServiceAccount(account)}
	return cfg, nil
}

// Nodes counts the cluster's nodes.
func (m *Manager) Nodes(ctx context.Context, k Key) (int, error) {
	cfg, err := m.AdminConfig(k)
	if err != nil {
		return 0, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return 0, err
	}
	n, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	return len(n.Items), nil
}

// MintKubeconfig is a kubeconfig for the cluster's owner: a client certificate (CN the
// owner's DID, which Bootstrap binds to cluster-admin) from the cluster's CA, valid for ttl
// (0 means DefaultKubeconfigTTL; outside MinKubeconfigTTL..MaxKubeconfigTTL is a *TTLError),
// for the server URL given (the cluster's status.server, its gate). No token, no exec plugin.
func MintKubeconfig(root string, k Key, account, server string, ttl time.Duration) ([]byte, time.Time, error) {
	ttl, err := CheckTTL(ttl)
	if err != nil {
		return nil, time.Time{}, err
	}
	return mintKubeconfig(root, k, account, server, ttl)
}

// MintKubeconfigNoExpiry is MintKubeconfig with a certificate that lasts as long as the
// cluster's CA (10 years from the cluster's first start): for clients that cannot refresh.
// Revoking it means removing the owner's binding, not waiting for it to expire.
func MintKubeconfigNoExpiry(root string, k Key, account, server string) ([]byte, time.Time, error) {
	return mintKubeconfig(root, k, account, server, 0)
}

// mintKubeconfig issues for ttl, or until the CA expires when ttl is 0.
func mintKubeconfig(root string, k Key, account, server string, ttl time.Duration) ([]byte, time.Time, error) {
	l := LayoutFor(root, k.Namespace, k.Name)
	if _, err := os.Stat(l.PKI()); err != nil {
		return nil, time.Time{}, fmt.Errorf("cluster %s has no certificate authority yet (has it started?): %w", k, err)
	}
	p, err := loadPKI(l.PKI())
	if err != nil {
		return nil, time.Time{}, err
	}
	if ttl == 0 {
		// A minute short of the CA's end, so the leaf never outlives its issuer.
		if ttl = time.Until(p.CA.NotAfter) - time.Minute; ttl <= 0 {
			return nil, time.Time{}, fmt.Errorf("the certificate authority of cluster %s has expired", k)
		}
	}
	crt, key, notAfter, err := p.IssueClient(account, nil, ttl)
	if err != nil {
		return nil, time.Time{}, err
	}
	b, err := kubeconfig(k.Name, server, p.CAPEM, crt, key)
	return b, notAfter, err
}

// MintKubeconfig is the package function for a cluster this manager runs.
func (m *Manager) MintKubeconfig(k Key, account string, ttl time.Duration) ([]byte, time.Time, error) {
	s := m.Status(k)
	if s.Server == "" {
		return nil, time.Time{}, fmt.Errorf("cluster %s is not managed here", k)
	}
	return MintKubeconfig(m.cfg.Root, k, account, s.Server, ttl)
}

func loadPKI(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	c, key, err := loadPair(p.path("ca"))
	if err != nil {
		return nil, fmt.Errorf("tenant CA in %s: %w", dir, err)
	}
	p.CA, p.CAKey = c, key
	p.CAPEM = certs.CertPEM(c.Raw)
	return p, nil
}

// RevokeIdentity removes an identity from a tenant cluster: its ServiceAccount
// (OwnerServiceAccount of the DID in OwnerNamespace) is deleted; so is every object the
// identity made (made, from the audit log: ServiceAccounts, RoleBindings and
// ClusterRoleBindings, each only if it is still the object created, by UID); and every
// ClusterRoleBinding and RoleBinding loses the subjects that name the DID as a user, that
// ServiceAccount or a ServiceAccount the identity made (a binding left with no subject is
// deleted). Kubeconfigs minted for the DID (CN the DID), applies made as the ServiceAccount
// and every token of a ServiceAccount it made are refused from then on. It answers what it
// removed (serviceaccount/<namespace>/<name>, clusterrolebinding/<name>,
// rolebinding/<namespace>/<name>). Idempotent: a second call removes nothing.
func RevokeIdentity(ctx context.Context, cs kubernetes.Interface, did string, made Attribution) ([]string, error) {
	var removed []string
	sa := OwnerServiceAccount(did)
	err := cs.CoreV1().ServiceAccounts(OwnerNamespace).Delete(ctx, sa, metav1.DeleteOptions{})
	switch {
	case err == nil:
		removed = append(removed, "serviceaccount/"+OwnerNamespace+"/"+sa)
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("deleting ServiceAccount %s/%s: %w", OwnerNamespace, sa, err)
	}
	for _, o := range made.Objects {
		uid := types.UID(o.UID)
		opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}
		switch o.Resource {
		case "serviceaccounts":
			err = cs.CoreV1().ServiceAccounts(o.Namespace).Delete(ctx, o.Name, opts)
		case "rolebindings":
			err = cs.RbacV1().RoleBindings(o.Namespace).Delete(ctx, o.Name, opts)
		case "clusterrolebindings":
			err = cs.RbacV1().ClusterRoleBindings().Delete(ctx, o.Name, opts)
		default:
			continue
		}
		switch {
		case err == nil:
			removed = append(removed, o.String())
		// Gone, or another object of that name since (the UID precondition): not ours.
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		default:
			return nil, fmt.Errorf("deleting %s: %w", o, err)
		}
	}
	madeSA := map[string]bool{}
	for _, u := range made.ServiceAccounts {
		madeSA[u] = true
	}
	names := func(subjects []rbacv1.Subject) ([]rbacv1.Subject, bool) {
		var keep []rbacv1.Subject
		for _, s := range subjects {
			if (s.Kind == rbacv1.UserKind && s.Name == did) || (s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && s.Namespace == OwnerNamespace) ||
				(s.Kind == rbacv1.ServiceAccountKind && madeSA[serviceAccountUser(s.Namespace, s.Name)]) {
				continue
			}
			keep = append(keep, s)
		}
		return keep, len(keep) != len(subjects)
	}
	crbs, err := cs.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ClusterRoleBindings: %w", err)
	}
	for i := range crbs.Items {
		b := &crbs.Items[i]
		keep, changed := names(b.Subjects)
		if !changed {
			continue
		}
		if len(keep) == 0 {
			err = cs.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &b.UID}})
		} else {
			b.Subjects = keep
			_, err = cs.RbacV1().ClusterRoleBindings().Update(ctx, b, metav1.UpdateOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("ClusterRoleBinding %s: %w", b.Name, err)
		}
		removed = append(removed, "clusterrolebinding/"+b.Name)
	}
	rbs, err := cs.RbacV1().RoleBindings("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing RoleBindings: %w", err)
	}
	for i := range rbs.Items {
		b := &rbs.Items[i]
		keep, changed := names(b.Subjects)
		if !changed {
			continue
		}
		if len(keep) == 0 {
			err = cs.RbacV1().RoleBindings(b.Namespace).Delete(ctx, b.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &b.UID}})
		} else {
			b.Subjects = keep
			_, err = cs.RbacV1().RoleBindings(b.Namespace).Update(ctx, b, metav1.UpdateOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("RoleBinding %s/%s: %w", b.Namespace, b.Name, err)
		}
		removed = append(removed, "rolebinding/"+b.Namespace+"/"+b.Name)
	}
	return removed, nil
}
