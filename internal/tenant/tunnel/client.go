package tunnel

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rancher/remotedialer"
	"github.com/sirupsen/logrus"
)

// Client is a node agent's end: it holds the node's tunnel to its cluster's gate open and
// dials what the apiserver asks for, if Allow says so.
type Client struct {
	// Gate is the cluster's gate, host:port.
	Gate string
	// TLS verifies the gate with the cluster's CA and presents the node's client
	// certificate (GetClientCertificate reads the current one at each connect).
	TLS *tls.Config
	// Allow decides what may be dialled (AllowInCluster).
	Allow func(netip.AddrPort) bool
	// Dial dials inside the node (in its network namespace).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logf logs a connect or a lost tunnel.
	Logf func(format string, args ...any)
}

// Run keeps the tunnel open until ctx ends, reconnecting with a growing pause (at most 5 s).
func (c *Client) Run(ctx context.Context) {
	tc := c.TLS.Clone()
	// The tunnel protocol tells the gate what this connection is; the websocket itself is
	// HTTP/1.1, which is what the gate's tunnel server negotiates.
	tc.NextProtos = []string{ALPN, "http/1.1"}
	d := &websocket.Dialer{TLSClientConfig: tc, HandshakeTimeout: 10 * time.Second, Proxy: nil}
	auth := func(proto, address string) bool {
		ap, err := netip.ParseAddrPort(address)
		ok := proto == "tcp" && err == nil && c.Allow(ap)
		if !ok {
			c.Logf("tunnel: refused to dial %s %s for the apiserver", proto, address)
		}
		return ok
	}
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := remotedialer.ConnectToProxyWithDialer(ctx, "wss://"+c.Gate+Path, http.Header{}, auth, d, c.Dial, func(context.Context, *remotedialer.Session) error {
			c.Logf("tunnel to %s open", c.Gate)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 30*time.Second {
			pause = 100 * time.Millisecond
		}
		c.Logf("tunnel to %s: %v; again in %s", c.Gate, err, pause)
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

func init() {
	// remotedialer reports through logrus, at every connect and every lost tunnel; the
	// Client and the Server log what matters themselves.
	logrus.SetOutput(io.Discard)
}
