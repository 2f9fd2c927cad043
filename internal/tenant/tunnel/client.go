package tunnel

import (
	"context"
	"crypto/tls"
	"fmt"
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
	// What may be dialled is decided in dial, not by remotedialer's authorizer: a refusal
	// there ends the whole session, dropping every stream of the node (exec, logs -f) and
	// the tunnel itself, so an owner who wrote a Node address or webhook URL the node
	// refuses could keep their cluster's tunnels flapping. A refused dial ends its own
	// connection only.
	auth := func(string, string) bool { return true }
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(address)
		if network != "tcp" || err != nil || !c.Allow(ap) {
			c.Logf("tunnel: refused to dial %s %s for the apiserver", network, address)
			return nil, fmt.Errorf("the node refuses to dial %s %s: only its cluster's pods and Services and its own kubelet", network, address)
		}
		return c.Dial(ctx, network, address)
	}
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := remotedialer.ConnectToProxyWithDialer(ctx, "wss://"+c.Gate+Path, http.Header{}, auth, d, dial, func(context.Context, *remotedialer.Session) error {
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
