package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/tenant/tunnel"
	"socialweb.computer/internal/testenv"
)

// A released node's credentials stop working at once. The row rents a real node through
// the market (up's node bidder), keeps a copy of its join bundle's kubeconfig as its bidder
// or a tenant inside the guest could, and releases the node (its pod gone, past the scale
// hold). With the kept kubeconfig, before the release then after: list the Nodes, create its
// Node again (NodeRestriction lets a node create its own), request its own kubelet client
// certificate (the floor admits a node's own renewal), open a tunnel at the cluster's gate.
// Before, each works; after, each is refused (401), the tunnel and the watch it held open
// before the release are closed, and the same holds after up restarts on its data dir.
func TestSecurity_ReleasedNodeCredentialsRevoked(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	ctx := context.Background()
	kc := n.cluster("rv1", "maxNodes: 1, scaleHold: 3s")
	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("rv1", 1, 120*time.Second) {
		claim = c
	}
	nodeName := claim.Spec.NodeName
	waitPod(t, kc, "hello", "Succeeded", nodeName, 90*time.Second)

	// The bundle the node was handed, kept.
	var bundle corev1.Secret
	key := client.ObjectKey{Namespace: claim.Status.Infra.Workspace, Name: infra.NodeBundleSecretName(claim.Status.Infra.Name, claim.Status.Infra.Contract)}
	if err := n.c.Get(ctx, key, &bundle); err != nil {
		t.Fatal(err)
	}
	kept := bundle.Data[tenant.BundleKeyKubeconfig]
	nodeCS := clientsetFromKubeconfig(t, kept)
	cert, caPool, gateAddr := nodeCredentials(t, kept)

	// Before the release every use of the node's credentials works.
	attacks := nodeAttacks(nodeCS, nodeName, cert, caPool, gateAddr)
	for _, a := range attacks {
		if err := a.run(ctx); err != nil {
			t.Fatalf("before the release, %s: %v", a.what, err)
		}
	}
	// A tunnel and a watch held open across the release.
	ws, code := openTunnel(cert, caPool, gateAddr)
	if ws == nil {
		t.Fatalf("before the release, a tunnel: %d", code)
	}
	defer ws.Close()
	tunnelClosed := make(chan error, 1)
	go func() {
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				tunnelClosed <- err
				return
			}
		}
	}()
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	timeout := int64(600)
	rc, err := clientcmd.RESTConfigFromKubeConfig(kept)
	if err != nil {
		t.Fatal(err)
	}
	watchCS := kubernetes.NewForConfigOrDie(rc) // no client timeout: the watch ends only if the server ends it
	w, err := watchCS.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{TimeoutSeconds: &timeout})
	if err != nil {
		t.Fatalf("before the release, a watch of Nodes: %v", err)
	}
	defer w.Stop()
	watchEnded := make(chan struct{})
	go func() {
		for range w.ResultChan() {
		}
		close(watchEnded)
	}()

	// Release: the pod is gone, the node empty past the scale hold, its claim deleted.
	tkubectl(t, kc, "", "delete", "pod", "hello")
	testenv.Eventually(t, 90*time.Second, "the claim gone", func() (bool, error) {
		cs := n.claims("rv1")
		return len(cs) == 0, lazyErr(func() string { return fmt.Sprintf("%d claims\n%s", len(cs), n.dump()) })
	})
	released := time.Now()

	refusedAll := func(when string) {
		t.Helper()
		for _, a := range attacks {
			if err := a.run(ctx); !apierrors.IsUnauthorized(err) && !apierrors.IsForbidden(err) && !isTunnelRefusal(err) {
				t.Errorf("%s, %s: %v, want refused", when, a.what, err)
			}
		}
	}
	refusedAll("after the release")
	select {
	case <-tunnelClosed:
	case <-time.After(5 * time.Second):
		t.Error("the tunnel opened before the release is still open 5 s after it")
	}
	select {
	case <-watchEnded:
	case <-time.After(5 * time.Second):
		t.Error("the watch opened before the release still streams 5 s after it")
	}
	t.Logf("claim gone -> every attack checked in %.2fs", time.Since(released).Seconds())
	if out, _ := tkubectlErr(kc, "get", "nodes", "-o", "name"); out != "" {
		t.Errorf("nodes after the release: %q", out)
	}

	// The revocation is state, not memory: up restarted on its data dir refuses the same.
	n.up.stop(t)
	n.up = startUp(t, n.dir)
	n.c = coreClient(t, n.dir) // the core listens on a new port
	waitPhase(t, n.c, client.ObjectKey{Namespace: "default", Name: "rv1"}, v1alpha1.ClusterReady, 60*time.Second)
	testenv.Eventually(t, 30*time.Second, "the cluster answering its owner again", func() (bool, error) {
		_, err := tkubectlErr(kc, "get", "ns", "default")
		return err == nil, err
	})
	refusedAll("after up restarted")
}

// nodeCredentials are a node kubeconfig's client certificate, its CA and the gate's address.
func nodeCredentials(t *testing.T, kc []byte) (tls.Certificate, *x509.CertPool, string) {
	t.Helper()
	cfg, err := clientcmd.Load(kc)
	if err != nil {
		t.Fatal(err)
	}
	cur := cfg.Contexts[cfg.CurrentContext]
	ai, cl := cfg.AuthInfos[cur.AuthInfo], cfg.Clusters[cur.Cluster]
	cert, err := tls.X509KeyPair(ai.ClientCertificateData, ai.ClientKeyData)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cl.CertificateAuthorityData) {
		t.Fatal("no CA in the node's kubeconfig")
	}
	u, err := url.Parse(cl.Server)
	if err != nil {
		t.Fatal(err)
	}
	return cert, pool, u.Host
}

type nodeAttack struct {
	what string
	run  func(context.Context) error
}

// nodeAttacks are what a holder of a node's credentials does with them; each returns nil
// when it worked.
func nodeAttacks(cs kubernetes.Interface, nodeName string, cert tls.Certificate, caPool *x509.CertPool, gate string) []nodeAttack {
	return []nodeAttack{
		{"list Nodes", func(ctx context.Context) error {
			_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create its Node again", func(ctx context.Context) error {
			_, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return nil // authenticated and authorized; the Node is still there
			}
			return err
		}},
		{"request its own kubelet client certificate", func(ctx context.Context) error {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				return err
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: tenant.NodeUserPrefix + nodeName, Organization: []string{"system:nodes"}}}, k)
			if err != nil {
				return err
			}
			csr := &certificatesv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
				Spec: certificatesv1.CertificateSigningRequestSpec{
					Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
					SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
					Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
				},
			}
			_, err = cs.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{})
			return err
		}},
		{"open a tunnel at the gate", func(context.Context) error {
			ws, code := openTunnel(cert, caPool, gate)
			if ws == nil {
				return tunnelRefusal(code)
			}
			ws.Close()
			return nil
		}},
	}
}

// tunnelRefusal is the gate's answer to a tunnel it did not open.
type tunnelRefusal int

func (c tunnelRefusal) Error() string { return fmt.Sprintf("tunnel refused: %d", int(c)) }

// isTunnelRefusal: the gate answered 401 or 403 (a dial that failed is not a refusal).
func isTunnelRefusal(err error) bool {
	c, ok := err.(tunnelRefusal)
	return ok && (c == http.StatusUnauthorized || c == http.StatusForbidden)
}

// openTunnel opens a node's tunnel websocket as its agent does; nil and the status when
// refused.
func openTunnel(cert tls.Certificate, caPool *x509.CertPool, gate string) (*websocket.Conn, int) {
	d := websocket.Dialer{HandshakeTimeout: 10 * time.Second, TLSClientConfig: &tls.Config{RootCAs: caPool, ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{cert}, NextProtos: []string{tunnel.ALPN, "http/1.1"}}}
	ws, resp, err := d.Dial("wss://"+gate+tunnel.Path, nil)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	if err != nil {
		return nil, code
	}
	return ws, code
}
