package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// A member who, before being revoked, minted service-account tokens with their rights keeps
// none of them: a token of a ServiceAccount they made and bound to cluster-admin, a
// TokenRequest for an existing ServiceAccount and one bound to a running pod are all refused
// by the tenant apiserver once revokeIdentity has returned (and the control plane has
// applied it), and what they made is gone. A token the member did not mint but could have
// read (an unbound token of the same existing ServiceAccount) stops verifying too: the
// signing key is rotated. The pod's own token, the one its node requested, keeps working,
// and the node's next request (the kubelet's refresh) gets a token of the new key.
//
// The pod's node is a node identity from the cluster's CA (the join bundle a node guest
// gets) acting as its kubelet does: it registers its Node and requests its pod's projected
// token with the same TokenRequest; no container runs, none is needed for what the
// apiserver decides.
func TestSecurity_RevokeEndsTokens(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	gwURL, pdsURL := up.phase(t, "gateway serving at "), up.phase(t, "PDS serving at ")
	aud, err := gateway.DIDForURL(gwURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, acct, _ := ownerCaller(t, up, pdsURL, gwURL, aud)
	a.must(cluster.CreateClusterNSID, map[string]string{"name": "r1"}, nil)
	v := a.waitPhase("r1", "Ready", 4*time.Minute)
	server := *v.Server
	key := tenant.Key{Namespace: gateway.AccountNamespace(acct.DID), Name: "r1"}
	root := filepath.Join(dir, "tenants")
	layout := tenant.LayoutFor(root, key.Namespace, key.Name)
	caPEM, err := os.ReadFile(filepath.Join(layout.PKI(), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}

	// The member: the owner's DID with a kubeconfig from getKubeconfig (cluster-admin).
	var kc cluster.GetKubeconfigOutput
	a.must(cluster.GetKubeconfigNSID, map[string]any{"name": "r1", "ttlSeconds": 600}, &kc)
	member := clientsetFromKubeconfig(t, []byte(kc.Kubeconfig))
	// The cluster's own side, which is not the member: its admin certificate, and a node.
	admin, err := kubernetes.NewForConfig(&rest.Config{Host: server, Timeout: 10 * time.Second, WarningHandler: rest.NoWarnings{}, TLSClientConfig: rest.TLSClientConfig{
		CAData: caPEM, CertFile: filepath.Join(layout.PKI(), "admin.crt"), KeyFile: filepath.Join(layout.PKI(), "admin.key")}})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := tenant.MintNodeBundle(root, key, "n1", server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node := clientsetFromKubeconfig(t, bundle.Kubeconfig)
	asToken := func(tok string) kubernetes.Interface {
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: server, BearerToken: tok, Timeout: 10 * time.Second, WarningHandler: rest.NoWarnings{},
			TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	// A token works when it may list pods in kube-system (every ServiceAccount here may).
	use := func(tok string) error {
		_, err := asToken(tok).CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
		return err
	}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// An existing ServiceAccount with rights, made by the cluster's admin, and a pod that
	// runs as it on node n1.
	must("deployer", create(ctx, admin.CoreV1().ServiceAccounts("kube-system"), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "deployer"}}))
	must("deployer binding", create(ctx, admin.RbacV1().RoleBindings("kube-system"), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "deployer-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "deployer", Namespace: "kube-system"}},
	}))
	must("node n1 registers", create(ctx, node.CoreV1().Nodes(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1"}, Spec: corev1.PodSpec{
		ServiceAccountName: "deployer", NodeName: "n1",
		Containers: []corev1.Container{{Name: "c", Image: "socialweb.computer/pause:local", ImagePullPolicy: corev1.PullNever}},
	}}
	pod, err = admin.CoreV1().Pods("kube-system").Create(ctx, pod, metav1.CreateOptions{})
	must("pod p1", err)
	podRef := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	kubeletToken := func() string {
		t.Helper()
		var tok string
		// The Node authorizer learns of the pod on n1 from its informers: retry briefly.
		testenv.Eventually(t, 10*time.Second, "n1 requests p1's token", func() (bool, error) {
			var err error
			tok, err = tokenFor(ctx, node, "kube-system", "deployer", 3607, podRef)
			return err == nil, err
		})
		return tok
	}
	podToken := kubeletToken()
	unboundByAdmin, err := tokenFor(ctx, admin, "kube-system", "deployer", 3600, nil)
	must("an unbound token minted by the admin", err)

	// The member's tokens: a ServiceAccount of their own bound to cluster-admin and a token
	// of it; a TokenRequest for the existing ServiceAccount; one bound to the running pod.
	must("member's ServiceAccount", create(ctx, member.CoreV1().ServiceAccounts("default"), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "backdoor"}}))
	must("member's binding", create(ctx, member.RbacV1().ClusterRoleBindings(), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "backdoor-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "backdoor", Namespace: "default"}},
	}))
	minted := map[string]string{}
	minted["own ServiceAccount bound to cluster-admin"], err = tokenFor(ctx, member, "default", "backdoor", 3600, nil)
	must("member's token of backdoor", err)
	minted["TokenRequest for an existing ServiceAccount"], err = tokenFor(ctx, member, "kube-system", "deployer", 3600, nil)
	must("member's token of deployer", err)
	minted["TokenRequest bound to a running pod"], err = tokenFor(ctx, member, "kube-system", "deployer", 3607, podRef)
	must("member's pod-bound token of deployer", err)
	// With the cluster-admin token, one more token: made with what the member made.
	minted["token made with the member's token"], err = tokenFor(ctx, asToken(minted["own ServiceAccount bound to cluster-admin"]), "kube-system", "deployer", 3600, nil)
	must("a token made with the member's token", err)
	for what, tok := range minted {
		if err := use(tok); err != nil {
			t.Fatalf("before revocation, %s: %v", what, err)
		}
	}
	// A client certificate is the one credential no rotation ends: the member (cluster-admin,
	// who could approve it) may not ask for one through the CSR API, for its own name or
	// another's, nor through the ServiceAccount it bound to cluster-admin. A node's renewal
	// of its own passes.
	csrKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must("a CSR key", err)
	csrFor := func(cn string, groups ...string) []byte {
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: groups}}, csrKey)
		must("a CSR", err)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	}
	csr := func(cs kubernetes.Interface, name, signer string, req []byte) error {
		return create(ctx, cs.CertificatesV1().CertificateSigningRequests(), &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: req, SignerName: signer, Usages: []certificatesv1.KeyUsage{certificatesv1.UsageClientAuth, certificatesv1.UsageDigitalSignature}}})
	}
	for _, c := range []struct {
		what   string
		cs     kubernetes.Interface
		signer string
		req    []byte
	}{
		{"the member, for itself", member, certificatesv1.KubeAPIServerClientSignerName, csrFor(acct.DID)},
		{"the member, for system:masters", member, certificatesv1.KubeAPIServerClientSignerName, csrFor("backdoor", "system:masters")},
		{"the member, as a node", member, certificatesv1.KubeAPIServerClientKubeletSignerName, csrFor("system:node:n9", "system:nodes")},
		{"the member's cluster-admin ServiceAccount", asToken(minted["own ServiceAccount bound to cluster-admin"]), certificatesv1.KubeAPIServerClientSignerName, csrFor("backdoor")},
	} {
		if err := csr(c.cs, "mint-"+strings.ToLower(strings.NewReplacer(" ", "-", ",", "", "'", "", ":", "-").Replace(c.what)), c.signer, c.req); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "come from its gateway") {
			t.Errorf("a client certificate request by %s: %v, want Forbidden", c.what, err)
		}
	}
	if err := csr(node, "node-n1-renewal", certificatesv1.KubeAPIServerClientKubeletSignerName, csrFor("system:node:n1", "system:nodes")); err != nil {
		t.Errorf("node n1 renewing its client certificate: %v", err)
	}
	for what, tok := range map[string]string{"the pod's token": podToken, "an unbound token of the admin's": unboundByAdmin} {
		if err := use(tok); err != nil {
			t.Fatalf("before revocation, %s: %v", what, err)
		}
	}

	// revokeIdentity, then the control plane restarts with the revocation applied (a new
	// instance), and is Ready once the bootstrap has removed what the member made. While
	// it restarts a request may meet a 401 or 403 of a starting apiserver: only the answers
	// after that count.
	before := *v.Instance
	t0 := time.Now()
	a.must(cluster.RevokeIdentityNSID, map[string]string{"name": "r1", "did": acct.DID}, nil)
	testenv.Eventually(t, 3*time.Minute, "r1 Ready again on a new instance", func() (bool, error) {
		v := a.list()["r1"]
		return v.Phase == "Ready" && v.Instance != nil && *v.Instance != before, errors.New(v.Phase)
	})
	t.Logf("revokeIdentity -> Ready with the revocation applied in %.2fs", time.Since(t0).Seconds())
	refused := func(err error) bool { return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) }
	for what, tok := range minted {
		if err := use(tok); !refused(err) {
			t.Errorf("after revocation, %s answers %v", what, err)
		}
	}
	// Not minted by the member, but a token the member could have read: the rotation ends it.
	if err := use(unboundByAdmin); !apierrors.IsUnauthorized(err) {
		t.Errorf("an unbound token signed before the rotation: %v, want 401", err)
	}
	// The pod's own token still works, for at most MaxTokenLifetime after it was issued.
	if err := use(podToken); err != nil {
		t.Errorf("the pod's token after the revocation: %v", err)
	}
	claims := jwtClaims(t, podToken)
	if life := claims.Exp - claims.Iat; life != int64(tenant.MaxTokenLifetime/time.Second) {
		t.Errorf("the pod's token lives %d s, want the cap %v", life, tenant.MaxTokenLifetime)
	}
	// The kubelet's refresh: the node asks again and gets a token of the new key.
	refreshed := kubeletToken()
	if jwtKeyID(t, refreshed) == jwtKeyID(t, podToken) {
		t.Errorf("the refreshed token is signed with the retired key %s", jwtKeyID(t, podToken))
	}
	if err := use(refreshed); err != nil {
		t.Errorf("the pod's refreshed token: %v", err)
	}
	if err := use(podToken); err != nil {
		t.Errorf("the pod's first token after its refresh: %v", err)
	}

	// What the member made is gone; what the cluster's admin made is not.
	if _, err := admin.CoreV1().ServiceAccounts("default").Get(ctx, "backdoor", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the member's ServiceAccount: %v", err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Get(ctx, "backdoor-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the member's ClusterRoleBinding: %v", err)
	}
	if _, err := admin.CoreV1().ServiceAccounts("kube-system").Get(ctx, "deployer", metav1.GetOptions{}); err != nil {
		t.Errorf("the admin's ServiceAccount: %v", err)
	}
	if _, err := admin.RbacV1().RoleBindings("kube-system").Get(ctx, "deployer-edit", metav1.GetOptions{}); err != nil {
		t.Errorf("the admin's RoleBinding: %v", err)
	}
	// A fresh admin token of the same ServiceAccount works: the ServiceAccount is intact.
	fresh, err := tokenFor(ctx, admin, "kube-system", "deployer", 3600, nil)
	if err != nil || use(fresh) != nil {
		t.Errorf("a token minted after the revocation: %v / %v", err, use(fresh))
	}
	// The member's kubeconfig is refused too.
	if _, err := member.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); !refused(err) {
		t.Errorf("the member's kubeconfig after revocation: %v", err)
	}
}

func clientsetFromKubeconfig(t *testing.T, kc []byte) kubernetes.Interface {
	t.Helper()
	rc, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	rc.Timeout = 10 * time.Second
	rc.WarningHandler = rest.NoWarnings{}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

type creator[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
}

func create[T any](ctx context.Context, c creator[T], obj T) error {
	_, err := c.Create(ctx, obj, metav1.CreateOptions{})
	return err
}

// tokenFor requests a token of the ServiceAccount namespace/name as cs, bound to ref if given.
func tokenFor(ctx context.Context, cs kubernetes.Interface, namespace, name string, seconds int64, ref *authenticationv1.BoundObjectReference) (string, error) {
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds, BoundObjectRef: ref},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	if tr.Status.Token == "" {
		return "", errors.New("empty token")
	}
	return tr.Status.Token, nil
}

func jwtPart(t *testing.T, tok string, i int) []byte {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %d parts", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[i])
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jwtKeyID(t *testing.T, tok string) string {
	var h struct{ Kid string }
	if err := json.Unmarshal(jwtPart(t, tok, 0), &h); err != nil {
		t.Fatal(err)
	}
	return h.Kid
}

type tokenClaims struct{ Iat, Exp int64 }

func jwtClaims(t *testing.T, tok string) tokenClaims {
	var c tokenClaims
	if err := json.Unmarshal(jwtPart(t, tok, 1), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// The same revocation with a pod running on a real node rented through the market: the
// token its kubelet mounted into it (which the pod hands out) is still accepted after the
// revocation and the key rotation, while the member's TokenRequest bound to that same pod
// is refused. The pod keeps running.
func TestSecurity_RevokePodOnNode(t *testing.T) {
	t.Parallel()
	g := startGatewayNode(t, "rp", holdFor(time.Minute))
	a, acct := g.caller, g.acct
	ctx := context.Background()
	v := a.list()["rp"]
	server := *v.Server
	root := filepath.Join(g.dir, "tenants")
	layout := tenant.LayoutFor(root, gateway.AccountNamespace(acct.DID), "rp")
	caPEM, err := os.ReadFile(filepath.Join(layout.PKI(), "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(&rest.Config{Host: server, Timeout: 10 * time.Second, WarningHandler: rest.NoWarnings{}, TLSClientConfig: rest.TLSClientConfig{
		CAData: caPEM, CertFile: filepath.Join(layout.PKI(), "admin.crt"), KeyFile: filepath.Join(layout.PKI(), "admin.key")}})
	if err != nil {
		t.Fatal(err)
	}
	var kc cluster.GetKubeconfigOutput
	a.must(cluster.GetKubeconfigNSID, map[string]any{"name": "rp", "ttlSeconds": 600}, &kc)
	member := clientsetFromKubeconfig(t, []byte(kc.Kubeconfig))
	// Who a token is, as the apiserver says (any authenticated identity may ask).
	whoami := func(tok string) (*authenticationv1.UserInfo, error) {
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: server, BearerToken: tok, Timeout: 10 * time.Second, WarningHandler: rest.NoWarnings{},
			TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}})
		if err != nil {
			return nil, err
		}
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		return &r.Status.UserInfo, nil
	}

	// A pod whose init container hands out the token its kubelet mounted (as its
	// termination message, which the kubelet reports in the pod's status), then runs on.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sleeper"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "show", Image: node.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c", "cat /var/run/secrets/kubernetes.io/serviceaccount/token > /dev/termination-log"}}},
		Containers: []corev1.Container{{Name: "c", Image: node.BusyboxImage, ImagePullPolicy: corev1.PullNever,
			Command: []string{"/bin/sh", "-c", "exec sleep 3600"}}},
	}}
	pod, err = admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var podToken string
	testenv.Eventually(t, 180*time.Second, "the pod runs on a rented node with its token shown", func() (bool, error) {
		p, err := admin.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, st := range p.Status.InitContainerStatuses {
			if st.State.Terminated != nil {
				podToken = strings.TrimSpace(st.State.Terminated.Message)
			}
		}
		return p.Status.Phase == corev1.PodRunning && strings.Count(podToken, ".") == 2, fmt.Errorf("phase %s, message %q", p.Status.Phase, podToken)
	})
	if u, err := whoami(podToken); err != nil || u.Username != "system:serviceaccount:default:default" || len(u.Extra["authentication.kubernetes.io/pod-uid"]) != 1 {
		t.Fatalf("the pod's mounted token before revocation: %+v %v", u, err)
	}
	memberPodBound, err := tokenFor(ctx, member, "default", "default", 3607, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := whoami(memberPodBound); err != nil {
		t.Fatalf("the member's pod-bound token before revocation: %v", err)
	}

	before := *v.Instance
	a.must(cluster.RevokeIdentityNSID, map[string]string{"name": "rp", "did": acct.DID}, nil)
	testenv.Eventually(t, 3*time.Minute, "rp Ready again on a new instance", func() (bool, error) {
		v := a.list()["rp"]
		return v.Phase == "Ready" && v.Instance != nil && *v.Instance != before, errors.New(v.Phase)
	})
	if _, err := whoami(memberPodBound); !apierrors.IsUnauthorized(err) {
		t.Errorf("the member's token bound to the running pod after revocation: %v, want 401", err)
	}
	if u, err := whoami(podToken); err != nil || u.Username != "system:serviceaccount:default:default" {
		t.Errorf("the pod's mounted token after revocation: %+v %v", u, err)
	}
	if kid, err := tenant.KeyIDOfFile(filepath.Join(layout.PKI(), "sa.pub")); err != nil || kid == jwtKeyID(t, podToken) {
		t.Errorf("the mounted token's key %s, the cluster's key now %s (%v): no rotation happened", jwtKeyID(t, podToken), kid, err)
	}
	p, err := admin.CoreV1().Pods("default").Get(ctx, "sleeper", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodRunning || p.UID != pod.UID {
		t.Errorf("the pod after revocation: %v %v", p.Status.Phase, err)
	}
	// Admin: the cluster itself, not the member, ends the cluster.
	if err := admin.CoreV1().Pods("default").Delete(ctx, "sleeper", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	a.must(cluster.DeleteClusterNSID, map[string]string{"name": "rp"}, nil)
	testenv.Eventually(t, 90*time.Second, "rp gone", func() (bool, error) {
		_, ok := a.list()["rp"]
		return !ok, nil
	})
}
