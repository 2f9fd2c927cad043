package tunnel_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"socialweb.computer/internal/certs"
	"socialweb.computer/internal/tenant/gate"
	"socialweb.computer/internal/tenant/tunnel"
)

// env is a gate with a tunnel server, as the manager runs them, with the apiserver's
// egress socket; the "pods" are loopback servers.
type env struct {
	gate    *gate.Gate
	srv     *tunnel.Server
	egress  string
	caPool  *x509.CertPool
	issue   func(cn string, org ...string) tls.Certificate
	nodes   atomic.Pointer[[]tunnel.Node]
	backend net.Listener
	revoked sync.Map // node name -> true: its claim was released
}

// Pods are 127.0.0.0/24 and Services 127.0.2.0/24 here; 127.0.1.1 stands for the host.
var ranges = tunnel.Ranges{Pods: netip.MustParsePrefix("127.0.0.0/24"), Services: netip.MustParsePrefix("127.0.2.0/24")}

func newEnv(t *testing.T) *env {
	ca, caKey, err := certs.NewCA("cluster-ca")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{caPool: x509.NewCertPool()}
	e.caPool.AddCert(ca)
	e.issue = func(cn string, org ...string) tls.Certificate {
		c, k, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: cn, Organization: org}, Usage: x509.ExtKeyUsageClientAuth, Validity: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: k, Leaf: c}
	}
	sc, sk, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: "apiserver"}, Usage: x509.ExtKeyUsageServerAuth, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	serving := tls.Certificate{Certificate: [][]byte{sc.Raw}, PrivateKey: sk}

	// The "apiserver" behind the gate: a TLS server that says who it is.
	e.backend, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serving}})
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(e.backend, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "apiserver") }))
	t.Cleanup(func() { e.backend.Close() })

	e.gate, err = gate.Listen("127.0.0.1:0", e.backend.Addr().String(), serving)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.gate.Close)
	e.gate.Set(gate.Serving, "")
	e.nodes.Store(&[]tunnel.Node{})
	e.srv = tunnel.NewServer(ranges, func(context.Context, bool) ([]tunnel.Node, error) { return *e.nodes.Load(), nil },
		func(node string) bool { _, ok := e.revoked.Load(node); return ok }, slog.New(slog.DiscardHandler))
	e.gate.SetTunnel(tunnel.ALPN, &tls.Config{Certificates: []tls.Certificate{serving}, ClientCAs: e.caPool, ClientAuth: tls.RequireAndVerifyClientCert}, e.srv)

	e.egress = filepath.Join(t.TempDir(), "egress.sock")
	ln, err := net.Listen("unix", e.egress)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go e.srv.ServeConnect(ln)
	return e
}

// node starts a node's tunnel client with the node's certificate; its own address is
// nodeIP and its kubelet's port kubelet.
// It returns how many times the tunnel was opened.
func (e *env) node(t *testing.T, name string, nodeIP netip.Addr, kubelet uint16) *atomic.Int32 {
	cert := e.issue("system:node:"+name, "system:nodes")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	opens := &atomic.Int32{}
	c := &tunnel.Client{
		Gate:  e.gate.Addr(),
		TLS:   &tls.Config{RootCAs: e.caPool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}},
		Allow: tunnel.AllowInCluster(ranges, nodeIP, kubelet),
		Dial:  (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		Logf: func(format string, args ...any) {
			if strings.HasSuffix(format, " open") {
				opens.Add(1)
			}
			t.Logf(format, args...)
		},
	}
	go c.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for !e.srv.Connected(name) {
		if time.Now().After(deadline) {
			t.Fatalf("node %s's tunnel did not connect", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return opens
}

// connect is what the apiserver's egress selector does: CONNECT addr over the socket,
// then an HTTP GET through it. It returns the CONNECT's status line and the GET's body (or
// the refusal's). A dial the node refuses or fails is an end of stream after the 200: a
// tunnel's dial is answered asynchronously (as k3s's).
func (e *env) connect(t *testing.T, addr string) (string, string) {
	c, err := net.Dial("unix", e.egress)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return resp.Status, string(b)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	r2, err := http.ReadResponse(br, nil)
	if err != nil {
		return resp.Status, "error: " + err.Error()
	}
	b, _ := io.ReadAll(r2.Body)
	return resp.Status, string(b)
}

func serve(t *testing.T, addr, body string) (string, *atomic.Int32) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var hits atomic.Int32
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, body)
	}))
	return ln.Addr().String(), &hits
}

// A node's tunnel carries the apiserver's connections to its pods, its kubelet and Services,
// and nothing else: an address outside the cluster is refused by the server before any
// node is asked, a forged Node address is refused by the node, and only a node's
// certificate opens a tunnel. Ordinary clients of the gate still reach the apiserver.
func TestTunnelCarriesOnlyTheClustersAddresses(t *testing.T) {
	e := newEnv(t)
	pod, podHits := serve(t, "127.0.0.7:0", "pod")
	host, hostHits := serve(t, "127.0.1.1:0", "host secret")
	kubelet, _ := serve(t, "127.0.3.200:0", "kubelet")
	kubeletPort := netip.MustParseAddrPort(kubelet).Port()
	e.nodes.Store(&[]tunnel.Node{{
		Name:     "n1",
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/25")},
		// The owner can write a Node's addresses: one of the host's is claimed here.
		Addresses: []netip.Addr{netip.MustParseAddr("127.0.3.200"), netip.MustParseAddr("127.0.1.1")},
	}})

	// Before the node connects: no node, no dial.
	if st, _ := e.connect(t, pod); !strings.HasPrefix(st, "502") {
		t.Fatalf("CONNECT to a pod before its node's tunnel: %s, want 502", st)
	}
	opens := e.node(t, "n1", netip.MustParseAddr("127.0.3.200"), kubeletPort)

	if st, body := e.connect(t, pod); body != "pod" {
		t.Fatalf("CONNECT to the pod: %s %q", st, body)
	}
	if podHits.Load() != 1 {
		t.Fatalf("pod hits %d", podHits.Load())
	}
	if st, body := e.connect(t, kubelet); body != "kubelet" {
		t.Fatalf("CONNECT to the node's kubelet: %s %q", st, body)
	}
	// Another port of the node's own address: the agent refuses it.
	if st, body := e.connect(t, "127.0.3.200:22"); !strings.HasPrefix(body, "error: ") {
		t.Fatalf("CONNECT to another port of the node's address: %s %q, want refused", st, body)
	}
	// A Service address goes to a connected node, which dials it (here nothing listens).
	if st, body := e.connect(t, "127.0.2.9:80"); !strings.HasPrefix(body, "error: ") {
		t.Fatalf("CONNECT to a Service address nobody serves: %s %q", st, body)
	}

	// The host: claimed by the Node, so routed to n1's tunnel; n1 refuses to dial it.
	if st, body := e.connect(t, host); !strings.HasPrefix(body, "error: ") {
		t.Fatalf("CONNECT to a host address a Node claims: %s %q, want refused", st, body)
	}
	// An address nobody claims, and a name: refused by the server itself.
	for _, addr := range []string{"127.0.1.2:80", "localhost:80", "kubernetes.default.svc:443"} {
		if st, body := e.connect(t, addr); !strings.HasPrefix(st, "403") || !strings.Contains(body, "outside the cluster") {
			t.Fatalf("CONNECT %s: %s %q, want 403 outside the cluster", addr, st, body)
		}
	}
	if hostHits.Load() != 0 {
		t.Fatalf("the host's server was reached %d times", hostHits.Load())
	}
	// The refusals ended their own connections only: the tunnel stayed open throughout.
	if st, body := e.connect(t, pod); body != "pod" {
		t.Fatalf("CONNECT to the pod after the refusals: %s %q", st, body)
	}
	if n := opens.Load(); n != 1 {
		t.Fatalf("the tunnel was opened %d times: a refused dial dropped it", n)
	}

	// Only a node opens a tunnel: an admin's certificate, or none, is refused.
	for _, cert := range [][]tls.Certificate{{e.issue("admin", "system:masters")}, nil} {
		d := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: e.caPool, ServerName: "127.0.0.1", Certificates: cert, NextProtos: []string{tunnel.ALPN, "http/1.1"}}}
		ws, resp, err := d.Dial("wss://"+e.gate.Addr()+tunnel.Path, nil)
		if err == nil {
			ws.Close()
			t.Fatalf("a tunnel with %d certificates was accepted", len(cert))
		}
		if resp != nil && resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("a non-node tunnel: %d, want 401", resp.StatusCode)
		}
	}

	// Ordinary clients of the gate reach the apiserver as before.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: e.caPool, ServerName: "127.0.0.1"}}}
	resp, err := hc.Get(e.gate.URL() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "apiserver" {
		t.Fatalf("through the gate: %q", b)
	}
}

// dialTunnel opens a tunnel's websocket with cert as a node's agent does; it returns the
// connection (nil when refused) and the answer's status code.
func (e *env) dialTunnel(t *testing.T, cert tls.Certificate) (*websocket.Conn, int) {
	t.Helper()
	d := websocket.Dialer{TLSClientConfig: &tls.Config{RootCAs: e.caPool, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}, NextProtos: []string{tunnel.ALPN, "http/1.1"}}}
	ws, resp, err := d.Dial("wss://"+e.gate.Addr()+tunnel.Path, nil)
	code := 0
	if resp != nil {
		code = resp.StatusCode
	}
	if err != nil {
		return nil, code
	}
	return ws, code
}

// A released node's certificate opens no tunnel, and the tunnels it held are closed at its
// revocation; another node's stay.
func TestTunnelOfRevokedNodeRefusedAndClosed(t *testing.T) {
	e := newEnv(t)
	gone, kept := e.issue("system:node:n-gone", "system:nodes"), e.issue("system:node:n-kept", "system:nodes")
	wsGone, code := e.dialTunnel(t, gone)
	if wsGone == nil {
		t.Fatalf("the node's tunnel before its release: %d, want accepted", code)
	}
	defer wsGone.Close()
	wsKept, code := e.dialTunnel(t, kept)
	if wsKept == nil {
		t.Fatalf("the other node's tunnel: %d, want accepted", code)
	}
	defer wsKept.Close()
	for !e.srv.Connected("n-gone") || !e.srv.Connected("n-kept") {
		time.Sleep(10 * time.Millisecond)
	}

	e.revoked.Store("n-gone", true)
	if n := e.srv.Disconnect("n-gone"); n != 1 {
		t.Fatalf("Disconnect closed %d tunnels, want 1", n)
	}
	_ = wsGone.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := wsGone.ReadMessage(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the released node's open tunnel: read %v, want closed by the server", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.srv.Connected("n-gone") {
		if time.Now().After(deadline) {
			t.Fatal("the released node still has a session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ws, code := e.dialTunnel(t, gone); ws != nil || code != http.StatusUnauthorized {
		if ws != nil {
			ws.Close()
		}
		t.Fatalf("a new tunnel of the released node: %d, want 401", code)
	}
	if !e.srv.Connected("n-kept") {
		t.Fatal("the other node's tunnel was closed")
	}
}
