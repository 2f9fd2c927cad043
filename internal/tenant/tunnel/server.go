package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rancher/remotedialer"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ALPN is the protocol a node's agent names in its TLS handshake with the cluster's gate:
// the gate serves such a connection as a tunnel instead of passing it to the apiserver.
const ALPN = "socialweb-tunnel/1"

// Path is the tunnel's websocket endpoint.
const Path = "/tunnel"

// NodeLister returns the cluster's Nodes as routing sees them (a cached list is fine: a
// miss is listed again, see Server.Dial).
type NodeLister func(ctx context.Context, fresh bool) ([]Node, error)

// Revoked reports whether a node's credentials are revoked (its claim was released).
type Revoked func(node string) bool

// Server holds the tunnels of one cluster's nodes and dials through them.
type Server struct {
	ranges  Ranges
	nodes   NodeLister
	revoked Revoked
	log     *slog.Logger
	rd      *remotedialer.Server

	mu    sync.Mutex
	conns map[string]map[net.Conn]struct{} // the open tunnels' connections, by node
}

// NewServer is a Server for a cluster with ranges r whose Nodes nodes lists; a node revoked
// says is refused a tunnel (nil: none is).
func NewServer(r Ranges, nodes NodeLister, revoked Revoked, log *slog.Logger) *Server {
	if revoked == nil {
		revoked = func(string) bool { return false }
	}
	s := &Server{ranges: r, nodes: nodes, revoked: revoked, log: log, conns: map[string]map[net.Conn]struct{}{}}
	s.rd = remotedialer.New(s.authorize, func(w http.ResponseWriter, _ *http.Request, code int, err error) {
		http.Error(w, err.Error(), code)
	})
	return s
}

// authorize is nodeOf, and the node must not be revoked: a released node's certificates are
// refused (401) like no certificate.
func (s *Server) authorize(r *http.Request) (string, bool, error) {
	name, ok, err := nodeOf(r)
	if !ok || err != nil {
		return name, ok, err
	}
	if s.revoked(name) {
		s.log.Info("tunnel_refused_revoked_node", "node", name)
		return "", false, nil
	}
	return name, true, nil
}

// Disconnect closes every open tunnel of node (its claim was released) and returns how many.
// A tunnel being opened while it runs is closed by its own check once it is up.
func (s *Server) Disconnect(node string) int {
	s.mu.Lock()
	conns := s.conns[node]
	delete(s.conns, node)
	s.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	return len(conns)
}

func (s *Server) track(node string, c net.Conn) {
	s.mu.Lock()
	if s.conns[node] == nil {
		s.conns[node] = map[net.Conn]struct{}{}
	}
	s.conns[node][c] = struct{}{}
	s.mu.Unlock()
	// Revoked between the authorization and now: Disconnect may have run before the
	// connection was known.
	if s.revoked(node) {
		_ = c.Close()
	}
}

func (s *Server) untrack(node string, c net.Conn) {
	s.mu.Lock()
	delete(s.conns[node], c)
	if len(s.conns[node]) == 0 {
		delete(s.conns, node)
	}
	s.mu.Unlock()
}

// nodeOf authenticates a tunnel: the client certificate the TLS handshake verified against
// the cluster's CA, and it must be a node's (O=system:nodes, CN=system:node:NAME), as the
// apiserver's Node authorizer reads it. The tunnel is then that node's.
func nodeOf(r *http.Request) (string, bool, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return "", false, nil
	}
	c := r.TLS.VerifiedChains[0][0]
	name, ok := strings.CutPrefix(c.Subject.CommonName, "system:node:")
	if !ok || !slices.Contains(c.Subject.Organization, "system:nodes") {
		return "", false, nil
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", false, fmt.Errorf("node name %q: %s", name, strings.Join(errs, "; "))
	}
	return name, true, nil
}

// ServeHTTP accepts a node's tunnel (the gate hands it connections with ALPN).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != Path {
		http.NotFound(w, r)
		return
	}
	// The websocket takes the connection over (Hijack): it is kept by node, so that a
	// revocation can close it.
	name, _, _ := nodeOf(r)
	hw := &hijackWriter{ResponseWriter: w}
	defer func() {
		if hw.conn != nil {
			s.untrack(name, hw.conn)
		}
	}()
	hw.hijacked = func(c net.Conn) { s.track(name, c) }
	s.rd.ServeHTTP(hw, r)
}

// hijackWriter reports the connection an upgrade takes over.
type hijackWriter struct {
	http.ResponseWriter
	conn     net.Conn
	hijacked func(net.Conn)
}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be taken over")
	}
	c, rw, err := h.Hijack()
	if err == nil {
		w.conn = c
		w.hijacked(c)
	}
	return c, rw, err
}

func (w *hijackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Connected reports whether node has a tunnel open.
func (s *Server) Connected(node string) bool { return s.rd.HasSession(node) }

// Dial connects to addr (an IP literal and port) inside the cluster through the tunnel of
// the node Route picks. A name is never resolved.
func (s *Server) Dial(ctx context.Context, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("%q is not an IP address and port (names are not resolved): %w", addr, ErrOutsideCluster)
	}
	node, err := s.route(ctx, ap.Addr())
	if err != nil {
		return nil, err
	}
	return s.rd.Dialer(node)(ctx, "tcp", addr)
}

func (s *Server) route(ctx context.Context, a netip.Addr) (string, error) {
	nodes, err := s.nodes(ctx, false)
	if err != nil {
		return "", fmt.Errorf("list the cluster's nodes: %w", err)
	}
	node, err := Route(a, s.ranges, nodes, s.Connected)
	// A miss may be a node newer than the list (its pod CIDR or address not in it yet): list
	// again once (the lister holds a fresh list for 200 ms). A Service address with no
	// connected node is not a matter of the list.
	stale := errors.Is(err, ErrOutsideCluster) || errors.Is(err, ErrNoNode) && s.ranges.Pods.Contains(a.Unmap())
	if !stale {
		return node, err
	}
	if nodes, err = s.nodes(ctx, true); err != nil {
		return "", fmt.Errorf("list the cluster's nodes: %w", err)
	}
	return Route(a, s.ranges, nodes, s.Connected)
}

// ServeConnect answers the apiserver's egress selector on ln: one HTTP CONNECT per
// connection, dialled with Dial, then the bytes both ways. It returns when ln is closed.
func (s *Server) ServeConnect(ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.connect(c)
		}()
	}
}

func (s *Server) connect(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\nConnection: close\r\n\r\n")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	up, err := s.Dial(ctx, req.Host)
	cancel()
	if err != nil {
		status := "502 Bad Gateway"
		if errors.Is(err, ErrOutsideCluster) {
			status = "403 Forbidden"
		}
		s.log.Info("tunnel_dial_refused", "address", req.Host, "err", err.Error())
		// The apiserver puts the status line into its error: say why there.
		_, _ = fmt.Fprintf(c, "HTTP/1.1 %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", status, len(err.Error()), err.Error())
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	done := make(chan struct{}, 2)
	go func() {
		// What the apiserver sent after the CONNECT and before the answer is in br.
		_, _ = io.Copy(up, br)
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		n, err := io.Copy(c, up)
		if n == 0 && err != nil {
			// The node's answer to the dial comes this way: it refused or failed.
			s.log.Info("tunnel_dial_failed", "address", req.Host, "err", err.Error())
		}
		closeWrite(c)
		done <- struct{}{}
	}()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	// A tunnel's connection has no half-close: closing is the end of the stream.
	_ = c.Close()
}
