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

// newGate is a gate in front of a new backend, closed when the test ends, with the
// backend and the TLS config a client of the gate uses.
func newGate(t *testing.T) (*Gate, *httptest.Server, *tls.Config) {
	t.Helper()
	srv, clientTLS := backend(t)
	g, err := Listen("127.0.0.1:0", strings.TrimPrefix(srv.URL, "https://"), srv.TLS.Certificates[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g, srv, clientTLS
}

// awaitOpen waits up to within for the gate to count n open connections.
func awaitOpen(t *testing.T, g *Gate, n int, within time.Duration) {
	t.Helper()
	for end := time.Now().Add(within); ; {
		open, _ := g.Activity()
		if open == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d connections open, want %d", open, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestGateModes(t *testing.T) {
	g, srv, clientTLS := newGate(t)

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
	g, _, clientTLS := newGate(t)
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

// An asleep gate holds a request, asks for one wake however many requests come, and
// passes the held requests through once the cluster serves: they are late, not refused.
func TestGateAsleepHoldsAndWakes(t *testing.T) {
	g, _, clientTLS := newGate(t)
	wakes := make(chan struct{}, 8)
	g.OnWake(func() { wakes <- struct{}{} })
	g.Set(Asleep, "")

	type answer struct {
		code int
		at   time.Time
		err  error
	}
	answers := make(chan answer, 3)
	for range 3 {
		go func() {
			code, _, err := Probe(g.URL(), clientTLS)
			answers <- answer{code, time.Now(), err}
		}()
	}
	select {
	case <-wakes:
	case <-time.After(2 * time.Second):
		t.Fatal("no wake was asked for")
	}
	// Wait until all three are held, then a while more: none is answered meanwhile.
	awaitOpen(t, g, 3, 2*time.Second)
	select {
	case a := <-answers:
		t.Fatalf("a request was answered while asleep: %d %v", a.code, a.err)
	case <-time.After(300 * time.Millisecond):
	}
	if len(wakes) != 0 {
		t.Fatalf("%d more wakes asked for; one per sleep", len(wakes))
	}
	served := time.Now()
	g.Set(Serving, "")
	for range 3 {
		a := <-answers
		if a.err != nil || a.code != 401 || a.at.Before(served) {
			t.Fatalf("held request: %d %v at %v (served from %v); want the backend's 401 after the wake", a.code, a.err, a.at, served)
		}
	}
	// The gate counts a connection closed when both its halves are done, which may be just
	// after the client has its answer.
	for deadline := time.Now().Add(2 * time.Second); ; {
		open, last := g.Activity()
		if open == 0 && !last.Before(served) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("activity after the answers: %d open, last %v; want 0 open, last after %v", open, last, served)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A second sleep asks for a wake again; leaving it for Unavailable answers 503.
	g.Set(Asleep, "")
	go func() {
		code, b, err := Probe(g.URL(), clientTLS)
		if err == nil && !strings.Contains(b, "stopped for good") {
			code = -code
		}
		answers <- answer{code: code, err: err}
	}()
	select {
	case <-wakes:
	case <-time.After(2 * time.Second):
		t.Fatal("no wake was asked for in the second sleep")
	}
	g.Set(Unavailable, "stopped for good")
	if a := <-answers; a.err != nil || a.code != 503 {
		t.Fatalf("held request after the switch to Unavailable: %d %v; want 503 with the new message", a.code, a.err)
	}
}

// The gate holds at most MaxHeld connections; more are answered at once, not kept.
func TestGateAsleepHoldsBoundedly(t *testing.T) {
	g, _, clientTLS := newGate(t)
	g.Set(Asleep, "")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range MaxHeld {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	awaitOpen(t, g, MaxHeld, 5*time.Second)
	t0 := time.Now()
	code, b, err := Probe(g.URL(), clientTLS)
	if err != nil || code != 503 || !strings.Contains(b, "waking up") {
		t.Fatalf("request past MaxHeld: %d %q %v; want 503 waking up", code, b, err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("request past MaxHeld answered after %v; want at once", d)
	}
}

// A second address serves the same gate: its mode, and nothing once the gate is closed.
func TestGateAlsoListens(t *testing.T) {
	g, _, clientTLS := newGate(t)
	addr, err := g.AlsoListen("127.0.0.2:0")
	if err != nil {
		t.Skip("no second loopback address here:", err)
	}
	other := "https://" + addr.String()
	if code, b, err := Probe(other, clientTLS); err != nil || code != 503 || !strings.Contains(b, "not running") {
		t.Fatalf("second address, Unavailable: %d %q %v", code, b, err)
	}
	g.Set(Serving, "")
	if code, _, err := Probe(other, clientTLS); err != nil || code != 401 {
		t.Fatalf("second address, Serving: %d %v, want the backend's 401", code, err)
	}
	g.Close()
	if _, _, err := Probe(other, clientTLS); err == nil {
		t.Error("the second address answered after Close")
	}
	if _, err := g.AlsoListen("127.0.0.1:0"); err == nil {
		t.Error("a closed gate listened again")
	}
}
