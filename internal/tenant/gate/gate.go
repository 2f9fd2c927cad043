// Package gate is the proxy in front of one tenant cluster's apiserver, the address a
// Cluster's status.server names. While the cluster serves it passes TCP through untouched
// (TLS end to end: the tenant's own client-certificate authentication, its own 401 without a
// certificate, watches, exec and port-forward all work); otherwise it answers for the
// cluster itself, over TLS with the cluster's serving certificate, with a Kubernetes Status:
// 503 while the cluster is stopped or draining, 502 once its processes are reaped or when
// the apiserver does not answer. While the cluster sleeps it answers nothing yet: it holds
// each new connection, asks for a wake (OnWake), and passes the connections on once the
// cluster serves again, so a client's first request after a sleep is late, not refused.
//
// A connection whose TLS handshake names the tunnel protocol (SetTunnel) is a node's tunnel
// instead: the gate reads the ClientHello without answering it, and serves that connection
// itself (TLS with the cluster's serving certificate, the node's client certificate
// required); every other connection is passed on with the bytes read replayed first.
package gate

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Mode is what the gate does with a new connection.
type Mode int

const (
	// Serving passes connections through to the apiserver (502 when it does not answer).
	Serving Mode = iota
	// Unavailable answers 503: the cluster is stopped; its store is kept.
	Unavailable
	// Draining answers 503: the cluster is being deleted; the apiserver may still be running.
	Draining
	// Reaped answers 502: the cluster's processes are gone.
	Reaped
	// Asleep holds new connections (up to MaxHeld, each up to HoldTimeout) and asks for a
	// wake: the cluster's processes are stopped until a client comes.
	Asleep
)

func (m Mode) String() string {
	return [...]string{"Serving", "Unavailable", "Draining", "Reaped", "Asleep"}[m]
}

// Bounds of what an asleep gate holds: a client (or many) cannot make it keep more.
const (
	// MaxHeld is the most connections held at once; more are answered 503 at once.
	MaxHeld = 256
	// HoldTimeout is how long a held connection waits for the cluster to serve before the
	// gate answers it 503 itself.
	HoldTimeout = 30 * time.Second
)

// Gate is one listening proxy.
type Gate struct {
	ln      net.Listener
	also    []net.Listener // AlsoListen's, served alike
	backend string
	srv     *http.Server
	local   *chanListener

	mu      sync.Mutex
	mode    Mode
	message string
	conns   map[net.Conn]struct{}
	closed  bool
	// held are the connections waiting for an asleep cluster; closing a channel releases
	// its connection to whatever the mode then is.
	held      map[net.Conn]chan struct{}
	onWake    func()
	wakeAsked bool // onWake was called in this sleep
	// lastActive is when a client connection last opened or closed (tunnels aside).
	lastActive time.Time

	tunnelALPN string
	tunnel     *chanListener // served by tunnelSrv
	tunnelSrv  *http.Server
}

// SetTunnel serves connections whose ClientHello offers protocol alpn with h, over TLS
// with cfg (which should require and verify a client certificate). Tunnel connections do
// not depend on the mode and survive its changes. Call once, before clients come.
func (g *Gate) SetTunnel(alpn string, cfg *tls.Config, h http.Handler) {
	cfg = cfg.Clone()
	// The offered alpn routes the connection here; what runs on it is HTTP/1.1 (a
	// websocket), which is what is negotiated.
	cfg.NextProtos = []string{"http/1.1"}
	l := &chanListener{c: make(chan net.Conn), done: make(chan struct{}), addr: g.ln.Addr()}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: cfg, ErrorLog: log.New(io.Discard, "", 0)}
	g.mu.Lock()
	g.tunnelALPN, g.tunnel, g.tunnelSrv = alpn, l, srv
	g.mu.Unlock()
	go func() { _ = srv.ServeTLS(l, "", "") }()
}

// Listen starts a gate on addr (host:port on loopback) in front of backend (host:port),
// answering for the cluster with cert. It starts in mode Unavailable.
func Listen(addr, backend string, cert tls.Certificate) (*Gate, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	g := &Gate{ln: ln, backend: backend, mode: Unavailable, message: "the cluster is not running",
		conns: map[net.Conn]struct{}{}, held: map[net.Conn]chan struct{}{}, lastActive: time.Now()}
	g.local = &chanListener{c: make(chan net.Conn), done: make(chan struct{}), addr: ln.Addr()}
	g.srv = &http.Server{
		Handler:           http.HandlerFunc(g.answer),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}},
		// Clients dropped by a mode change are expected; their handshake errors are noise.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go func() { _ = g.srv.ServeTLS(g.local, "", "") }()
	go g.accept()
	return g, nil
}

// AlsoListen serves the gate on addr too: another address of the same cluster (a public
// one, where nodes on other hosts join), in the same modes, holding and tunnels.
func (g *Gate) AlsoListen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		ln.Close()
		return nil, net.ErrClosed
	}
	g.also = append(g.also, ln)
	g.mu.Unlock()
	go g.acceptOn(ln)
	return ln.Addr(), nil
}

// Addr is the gate's listening address.
func (g *Gate) Addr() string { return g.ln.Addr().String() }

// URL is the https URL clients use.
func (g *Gate) URL() string { return "https://" + g.Addr() }

// Mode returns the current mode.
func (g *Gate) Mode() Mode {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mode
}

// OnWake sets what an asleep gate calls, on a goroutine of its own, when a connection
// comes: once per sleep (the first connection), until the mode changes.
func (g *Gate) OnWake(f func()) {
	g.mu.Lock()
	g.onWake = f
	g.mu.Unlock()
}

// Activity is how many client connections are open (served, answered or held; a node's
// tunnel is not a client's) and when one last opened or closed.
func (g *Gate) Activity() (open int, last time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns) + len(g.held), g.lastActive
}

// Set switches the mode and closes every open connection, so that the next request of
// every client meets the new mode rather than a connection made under the old one. Held
// connections are not closed: leaving Asleep releases them to the new mode (passed
// through when it is Serving, answered by the gate otherwise).
func (g *Gate) Set(m Mode, message string) {
	g.mu.Lock()
	if g.mode == m && g.message == message {
		g.mu.Unlock()
		return
	}
	g.mode, g.message = m, message
	conns := g.conns
	g.conns = map[net.Conn]struct{}{}
	var release []chan struct{}
	if m != Asleep {
		for c, ch := range g.held {
			release = append(release, ch)
			delete(g.held, c)
		}
	}
	g.wakeAsked = false
	g.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	for _, ch := range release {
		close(ch)
	}
}

// Close stops listening and closes every connection.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	conns := g.conns
	g.conns = map[net.Conn]struct{}{}
	held := g.held
	g.held = map[net.Conn]chan struct{}{}
	tunnel, tunnelSrv := g.tunnel, g.tunnelSrv
	also := g.also
	g.mu.Unlock()
	g.ln.Close()
	for _, ln := range also {
		ln.Close()
	}
	g.local.Close()
	for c := range conns {
		c.Close()
	}
	for c, ch := range held {
		close(ch) // its handler finds the gate closed and drops it
		c.Close()
	}
	_ = g.srv.Close()
	if tunnel != nil {
		tunnel.Close()
		_ = tunnelSrv.Close()
	}
}

func (g *Gate) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.conns[c] = struct{}{}
	g.lastActive = time.Now()
	return true
}

func (g *Gate) untrack(c net.Conn) {
	g.mu.Lock()
	delete(g.conns, c)
	g.lastActive = time.Now()
	g.mu.Unlock()
}

// hold keeps c while the gate is asleep, until the mode changes or HoldTimeout passes; it
// asks for a wake on the first connection of a sleep. It returns at once when the gate is
// not asleep or holds MaxHeld already.
func (g *Gate) hold(c net.Conn) {
	g.mu.Lock()
	if g.mode != Asleep || g.closed || len(g.held) >= MaxHeld {
		g.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	g.held[c] = ch
	g.lastActive = time.Now()
	var wake func()
	if !g.wakeAsked {
		g.wakeAsked, wake = true, g.onWake
	}
	g.mu.Unlock()
	if wake != nil {
		go wake()
	}
	t := time.NewTimer(HoldTimeout)
	defer t.Stop()
	select {
	case <-ch:
		return
	case <-t.C:
	}
	g.mu.Lock()
	if _, ok := g.held[c]; ok {
		delete(g.held, c)
		g.lastActive = time.Now()
	}
	g.mu.Unlock()
}

func (g *Gate) accept() { g.acceptOn(g.ln) }

func (g *Gate) acceptOn(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go g.handle(c)
	}
}

func (g *Gate) handle(c net.Conn) {
	g.mu.Lock()
	alpn, tunnel := g.tunnelALPN, g.tunnel
	g.mu.Unlock()
	if tunnel != nil {
		offered, replay, err := peekALPN(c)
		if err != nil {
			c.Close()
			return
		}
		c = replay
		if slices.Contains(offered, alpn) {
			tunnel.push(c)
			return
		}
	}
	g.hold(c)
	if !g.track(c) {
		c.Close()
		return
	}
	if g.Mode() == Serving {
		b, err := net.DialTimeout("tcp", g.backend, 2*time.Second)
		if err == nil {
			g.splice(c, b)
			return
		}
	}
	// Answer for the cluster; the HTTP server owns the connection from here.
	g.local.push(&trackedConn{Conn: c, g: g})
}

func (g *Gate) splice(c, b net.Conn) {
	defer g.untrack(c)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(b, c)
	go cp(c, b)
	<-done
	// One direction ended (or the gate closed the client side on a mode change): end both.
	c.Close()
	b.Close()
	<-done
}

// answer is the gate's own reply: a Kubernetes Status, so kubectl prints the message.
func (g *Gate) answer(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	mode, msg := g.mode, g.message
	g.mu.Unlock()
	code, reason := http.StatusServiceUnavailable, "ServiceUnavailable"
	if mode == Asleep {
		msg = "the cluster is waking up; try again shortly"
	}
	switch mode {
	case Reaped, Serving:
		// Serving reaches here only when the apiserver did not answer the dial.
		code, reason = http.StatusBadGateway, "BadGateway"
		if mode == Serving {
			msg = "the cluster's apiserver does not answer"
		}
	}
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Socialweb-Gate", mode.String())
	w.Header().Set("Connection", "close")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code,
	})
}

// Probe is for tests and benchmarks: the HTTP status of GET /version through the gate with
// the given client TLS config, or an error when the gate does not answer.
func Probe(url string, cfg *tls.Config) (int, string, error) {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	resp, err := hc.Get(url + "/version")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b), nil
}

type trackedConn struct {
	net.Conn
	g    *Gate
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() { c.g.untrack(c.Conn) })
	return c.Conn.Close()
}

// chanListener hands accepted connections to the HTTP server.
type chanListener struct {
	c    chan net.Conn
	done chan struct{}
	once sync.Once
	addr net.Addr
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.c <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.c:
		return c, nil
	case <-l.done:
		return nil, errors.New("gate closed")
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// PortOf is the port of a host:port.
func PortOf(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

var errPeeked = errors.New("client hello read")

// peekALPN reads c's TLS ClientHello and returns the protocols it offers, with a conn that
// replays what was read before reading on. Nothing is written to c meanwhile. A client that
// sends no ClientHello within 10 s is dropped.
func peekALPN(c net.Conn) ([]string, net.Conn, error) {
	rec := &recordingConn{Conn: c}
	var offered []string
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	err := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		offered = h.SupportedProtos
		return nil, errPeeked
	}}).Handshake()
	_ = c.SetReadDeadline(time.Time{})
	if !errors.Is(err, errPeeked) {
		// Not TLS, or cut short: the apiserver (or the gate's own answer) would refuse it
		// as well; pass it on as it came.
		if rec.buf.Len() == 0 {
			return nil, nil, err
		}
	}
	return offered, &replayConn{Conn: c, pending: &rec.buf}, nil
}

// recordingConn keeps what is read and drops what is written (a TLS alert).
type recordingConn struct {
	net.Conn
	buf bytes.Buffer
}

func (r *recordingConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

func (r *recordingConn) Write(p []byte) (int, error) { return len(p), nil }

// replayConn reads what was peeked, then the connection.
type replayConn struct {
	net.Conn
	pending *bytes.Buffer
}

func (r *replayConn) Read(p []byte) (int, error) {
	if r.pending.Len() > 0 {
		return r.pending.Read(p)
	}
	return r.Conn.Read(p)
}

// WriteTo lets splice's copy of the rest run between the two sockets in the kernel.
func (r *replayConn) WriteTo(w io.Writer) (int64, error) {
	n, err := r.pending.WriteTo(w)
	if err != nil {
		return n, err
	}
	m, err := io.Copy(w, r.Conn)
	return n + m, err
}

// CloseWrite half-closes the underlying TCP connection (splice relies on it).
func (r *replayConn) CloseWrite() error {
	if tc, ok := r.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}
