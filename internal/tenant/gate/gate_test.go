package gate

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A TLS backend that answers 401 like an apiserver without a client certificate; the gate
// shares its certificate, as a tenant gate shares its apiserver's.
func backend(t *testing.T) (*httptest.Server, *tls.Config) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"kind":"Status","code":401}`))
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, &tls.Config{RootCAs: pool, ServerName: "example.com"}
}

func TestGateModes(t *testing.T) {
	srv, clientTLS := backend(t)
	cert := srv.TLS.Certificates[0]
	g, err := Listen("127.0.0.1:0", strings.TrimPrefix(srv.URL, "https://"), cert)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	expect := func(want int, body string) {
		t.Helper()
		code, b, err := Probe(g.URL(), clientTLS)
		if err != nil || code != want || !strings.Contains(b, body) {
			t.Fatalf("mode %s: %d %q %v; want %d containing %q", g.Mode(), code, b, err, want, body)
		}
	}
	expect(503, "not running") // a new gate: Unavailable
	g.Set(Serving, "")
	expect(401, `"code":401`) // passed through: the backend's own answer
	g.Set(Draining, "cluster c is being deleted")
	expect(503, "being deleted")
	g.Set(Reaped, "cluster c was deleted")
	expect(502, "was deleted")

	// Serving with a backend that does not answer is 502.
	srv.Close()
	g.Set(Serving, "")
	expect(502, "does not answer")

	g.Close()
	if _, _, err := Probe(g.URL(), clientTLS); err == nil {
		t.Error("a closed gate answered")
	}
}

// A mode change ends connections made under the previous mode (a kept-alive client meets
// the new mode on its next request).
func TestGateModeChangeClosesConnections(t *testing.T) {
	srv, clientTLS := backend(t)
	g, err := Listen("127.0.0.1:0", strings.TrimPrefix(srv.URL, "https://"), srv.TLS.Certificates[0])
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	g.Set(Serving, "")
	c, err := tls.Dial("tcp", g.Addr(), clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g.Set(Draining, "x")
	buf := make([]byte, 1)
	_ = c.SetReadDeadline(deadline())
	if _, err := c.Read(buf); err == nil {
		t.Error("the connection made while serving stayed open after the switch to Draining")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Error("the connection made while serving stayed open (read timed out)")
	}
}

func deadline() time.Time { return time.Now().Add(2 * time.Second) }
