package kube

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"

	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/tenant/volumes"
)

// provisionerSecrets are the local-path provisioner's credentials, made anew by each start of
// the control plane and kept only in its memory: the bearer token the provisioner presents
// and the proof the apiserver adds to its requests (volumes.ProofExtraKey), which the floor
// checks before it lets a node-filesystem volume through. Neither is in a file or an object,
// so the cluster's admin, who can impersonate any user and have any certificate signed, has
// no way to present them.
type provisionerSecrets struct {
	token, proof string
}

func newProvisionerSecrets() (provisionerSecrets, error) {
	rnd := func() (string, error) {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		return base64.RawURLEncoding.EncodeToString(b), nil
	}
	tok, err := rnd()
	if err != nil {
		return provisionerSecrets{}, err
	}
	proof, err := rnd()
	return provisionerSecrets{token: tok, proof: proof}, err
}

// provisionerAuthenticator answers for the provisioner's token (before any other
// authenticator) with volumes.ProvisionerUser carrying the proof.
type provisionerAuthenticator struct {
	inner   authenticator.Request
	secrets provisionerSecrets
}

func (a *provisionerAuthenticator) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	h := req.Header.Get("Authorization")
	if tok, ok := strings.CutPrefix(h, "Bearer "); ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), []byte(a.secrets.token)) == 1 {
		return &authenticator.Response{User: &user.DefaultInfo{
			Name:   volumes.ProvisionerUser,
			Groups: []string{user.AllAuthenticated},
			Extra:  map[string][]string{volumes.ProofExtraKey: {a.secrets.proof}},
		}}, true, nil
	}
	return a.inner.AuthenticateRequest(req)
}

// applyProvisionerAuth puts the provisioner's authenticator in front of every server of the
// chain, as applyTokenPolicy does.
func applyProvisionerAuth(config *apiserverapp.Config, s provisionerSecrets) {
	for _, g := range []*genericapiserver.Config{config.KubeAPIs.ControlPlane.Generic, &config.ApiExtensions.GenericConfig.Config, &config.Aggregator.GenericConfig.Config} {
		if g.Authentication.Authenticator != nil {
			g.Authentication.Authenticator = &provisionerAuthenticator{inner: g.Authentication.Authenticator, secrets: s}
		}
	}
}

// hasProof says whether u carries the provisioner's proof.
func hasProof(u user.Info, proof string) bool {
	if u == nil || proof == "" || u.GetName() != volumes.ProvisionerUser {
		return false
	}
	vals := u.GetExtra()[volumes.ProofExtraKey]
	return len(vals) == 1 && subtle.ConstantTimeCompare([]byte(vals[0]), []byte(proof)) == 1
}

// runProvisioner runs the local-path provisioner against the apiserver of spec with the
// in-process token.
func runProvisioner(ctx context.Context, spec tenant.ChildSpec, s provisionerSecrets) error {
	u, err := url.Parse(spec.ReadyzURL)
	if err != nil {
		return err
	}
	cfg := &rest.Config{
		Host:            u.Scheme + "://" + u.Host,
		BearerToken:     s.token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: spec.CAFile},
		UserAgent:       "local-path-provisioner",
		QPS:             20,
		Burst:           40,
	}
	client, err := clientset.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return volumes.NewProvisioner(client).Run(ctx)
}

// The local-path bootstrap: the StorageClass (when absent: an owner who changed or deleted it
// keeps their choice until the next start) and the provisioner's role and binding.
const localPathHook = "socialweb/local-path-storage"

func provisionerRBAC() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: volumes.ClusterRoleName},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"persistentvolumes"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{"storage.k8s.io"}, Resources: []string{"storageclasses"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: volumes.ClusterRoleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: volumes.ClusterRoleName},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: volumes.ProvisionerUser}},
	}
	return role, binding
}

func ensureLocalPathStorage(hc genericapiserver.PostStartHookContext) error {
	role, binding := provisionerRBAC()
	class := volumes.StorageClass()
	return pollNow(hc, "create the local-path StorageClass", func(ctx context.Context, client clientset.Interface) (bool, error) {
		if err := createOrUpdateRole(ctx, client, role); err != nil {
			klog.Infof("local-path provisioner role: %v; retrying", err)
			return false, nil
		}
		if err := createOrUpdateBinding(ctx, client, binding); err != nil {
			klog.Infof("local-path provisioner binding: %v; retrying", err)
			return false, nil
		}
		if err := createStorageClass(ctx, client, class); err != nil {
			klog.Infof("StorageClass %s: %v; retrying", class.Name, err)
			return false, nil
		}
		return true, nil
	})
}

func createOrUpdateRole(ctx context.Context, client clientset.Interface, want *rbacv1.ClusterRole) error {
	have, err := client.RbacV1().ClusterRoles().Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = client.RbacV1().ClusterRoles().Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil || equalRules(have.Rules, want.Rules) {
		return err
	}
	have.Rules = want.Rules
	_, err = client.RbacV1().ClusterRoles().Update(ctx, have, metav1.UpdateOptions{})
	return err
}

func equalRules(a, b []rbacv1.PolicyRule) bool {
	return slices.EqualFunc(a, b, func(x, y rbacv1.PolicyRule) bool {
		return slices.Equal(x.APIGroups, y.APIGroups) && slices.Equal(x.Resources, y.Resources) && slices.Equal(x.Verbs, y.Verbs) &&
			slices.Equal(x.ResourceNames, y.ResourceNames) && slices.Equal(x.NonResourceURLs, y.NonResourceURLs)
	})
}

func createOrUpdateBinding(ctx context.Context, client clientset.Interface, want *rbacv1.ClusterRoleBinding) error {
	have, err := client.RbacV1().ClusterRoleBindings().Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil || slices.Equal(have.Subjects, want.Subjects) && have.RoleRef == want.RoleRef {
		return err
	}
	// The role reference cannot change in place.
	if err := client.RbacV1().ClusterRoleBindings().Delete(ctx, want.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, want, metav1.CreateOptions{})
	return err
}

func createStorageClass(ctx context.Context, client clientset.Interface, class *storagev1.StorageClass) error {
	_, err := client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// startVolumeSweeper starts, in a kubelet's process, the sweep of deleted volumes'
// directories, when the node has the volumes directory (a contained node: contain.go mounts
// it) and args name the kubelet's kubeconfig and node.
func startVolumeSweeper(ctx context.Context, args []string) {
	if fi, err := os.Stat(volumes.NodeDir); err != nil || !fi.IsDir() {
		return
	}
	kubeconfig, node, certDir := flagValue(args, "kubeconfig"), flagValue(args, "hostname-override"), flagValue(args, "cert-dir")
	if kubeconfig == "" || node == "" {
		klog.Warningf("volume sweep off: the kubelet's --kubeconfig or --hostname-override is not given")
		return
	}
	client := func() (clientset.Interface, error) { return nodeClient(kubeconfig, certDir) }
	go volumes.RunSweeper(ctx, client, node, volumes.NodeDir, 2*time.Second)
}

// nodeClient is a client with the node's identity: the kubeconfig's, or the kubelet's
// renewed certificate (kubelet-client-current.pem in its cert dir) once it has one.
func nodeClient(kubeconfig, certDir string) (clientset.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	if certDir != "" {
		current := filepath.Join(certDir, "kubelet-client-current.pem")
		if _, err := os.Stat(current); err == nil {
			cfg.CertData, cfg.KeyData = nil, nil
			cfg.CertFile, cfg.KeyFile = current, current
		}
	}
	cfg.Timeout = 10 * time.Second
	return clientset.NewForConfig(cfg)
}

// flagValue is the value of --name in args (--name=v or --name v), or "".
func flagValue(args []string, name string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}
