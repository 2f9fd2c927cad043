package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
)

// streamPing is how often an idle subscription is pinged; a peer silent for two pings is
// dropped.
const streamPing = 30 * time.Second

var upgrader = websocket.Upgrader{
	ReadBufferSize: 1024, WriteBufferSize: 16 << 10,
	// Callers are programs holding a service-auth token, not pages: no Origin check.
	CheckOrigin: func(*http.Request) bool { return true },
}

// streamConn is one open subscription, closed when the server shuts down.
type streamConn struct {
	ws     *websocket.Conn
	cancel context.CancelFunc
}

func (s *Server) closeStreams() {
	s.streamsMu.Lock()
	defer s.streamsMu.Unlock()
	for c := range s.streams {
		c.cancel()
	}
}

// subscribeClusters streams the caller's clusters (or the one named), their members (#member:
// the owner and spec.members, sent when a member's state changes) and their NodeClaims:
// a snapshot on connect, #info SnapshotComplete, then every change. Each frame is one JSON
// text message, a subscribeClusters union member chosen by $type. The token is checked once,
// on the upgrade. When the core's watch ends (a restart, an expired resourceVersion) the
// connection is closed; the client reconnects and gets a fresh snapshot.
func (s *Server) subscribeClusters(w http.ResponseWriter, r *http.Request, account string) {
	only := r.URL.Query().Get("name")
	if only != "" {
		if err := checkName(only); err != nil {
			writeError(w, err)
			return
		}
	}
	ns := AccountNamespace(account)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Snapshot and watches start before the upgrade, so a core that cannot be read is an
	// XRPC error rather than a WebSocket that closes at once.
	var clusters v1alpha1.ClusterList
	if err := s.cfg.Client.List(ctx, &clusters, client.InNamespace(ns)); err != nil {
		writeError(w, err)
		return
	}
	var claims v1alpha1.NodeClaimList
	if err := s.cfg.Client.List(ctx, &claims, client.InNamespace(ns)); err != nil {
		writeError(w, err)
		return
	}
	cw, err := s.cfg.Client.Watch(ctx, &v1alpha1.ClusterList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: clusters.ResourceVersion}})
	if err != nil {
		writeError(w, err)
		return
	}
	defer cw.Stop()
	nw, err := s.cfg.Client.Watch(ctx, &v1alpha1.NodeClaimList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: claims.ResourceVersion}})
	if err != nil {
		writeError(w, err)
		return
	}
	defer nw.Stop()

	ws, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	defer ws.Close()
	sc := &streamConn{ws: ws, cancel: cancel}
	s.streamsMu.Lock()
	if s.streams == nil {
		s.streams = map[*streamConn]struct{}{}
	}
	s.streams[sc] = struct{}{}
	s.streamsMu.Unlock()
	defer func() {
		s.streamsMu.Lock()
		delete(s.streams, sc)
		s.streamsMu.Unlock()
	}()

	// The reader: pongs and the peer's close. Nothing a client sends means anything else.
	_ = ws.SetReadDeadline(time.Now().Add(2 * streamPing))
	ws.SetPongHandler(func(string) error { return ws.SetReadDeadline(time.Now().Add(2 * streamPing)) })
	ws.SetReadLimit(4 << 10)
	go func() {
		defer cancel()
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}()

	mine := func(c *v1alpha1.Cluster) bool {
		return c.Spec.Account == account && (only == "" || c.Name == only)
	}
	send := func(frame any) bool {
		b, err := json.Marshal(frame)
		if err != nil {
			return false
		}
		_ = ws.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return ws.WriteMessage(websocket.TextMessage, b) == nil
	}
	// NodeClaims are sent for the clusters this subscription shows (a claim's clusterRef
	// namespace defaults to its own).
	claimed := func(n *v1alpha1.NodeClaim, shown map[string]bool) bool {
		return shown[n.Spec.ClusterRef.Name] && (n.Spec.ClusterRef.Namespace == "" || n.Spec.ClusterRef.Namespace == ns)
	}
	shown := map[string]bool{}
	// members is what each shown cluster's #member frames said last.
	members := map[string]map[string]string{}
	sendMembers := func(name string, now map[string]string) bool {
		for _, f := range memberFrames(name, members[name], now) {
			if !send(f) {
				return false
			}
		}
		if now == nil {
			delete(members, name)
		} else {
			members[name] = now
		}
		return true
	}
	for i := range clusters.Items {
		if c := &clusters.Items[i]; mine(c) {
			shown[c.Name] = true
			if !send(clusterFrame(c, false)) || !sendMembers(c.Name, membersOf(c)) {
				return
			}
		}
	}
	for i := range claims.Items {
		if n := &claims.Items[i]; claimed(n, shown) {
			if !send(nodeClaimFrame(n, false)) {
				return
			}
		}
	}
	if !send(cluster.SubscribeClustersInfo{Name: cluster.SubscribeClustersInfoNameSnapshotComplete}) {
		return
	}

	ping := time.NewTicker(streamPing)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseGoingAway, "gateway stopping"), time.Now().Add(time.Second))
			return
		case <-ping.C:
			if ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(10*time.Second)) != nil {
				return
			}
		case ev, ok := <-cw.ResultChan():
			if !ok || ev.Type == watch.Error {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "watch ended; reconnect for a fresh snapshot"), time.Now().Add(time.Second))
				return
			}
			c, ok := ev.Object.(*v1alpha1.Cluster)
			if !ok || !mine(c) {
				continue
			}
			gone := ev.Type == watch.Deleted
			shown[c.Name] = !gone
			now := membersOf(c)
			if gone {
				now = nil
			}
			if !send(clusterFrame(c, gone)) || !sendMembers(c.Name, now) {
				return
			}
		case ev, ok := <-nw.ResultChan():
			if !ok || ev.Type == watch.Error {
				_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseTryAgainLater, "watch ended; reconnect for a fresh snapshot"), time.Now().Add(time.Second))
				return
			}
			n, ok := ev.Object.(*v1alpha1.NodeClaim)
			if !ok || !claimed(n, shown) {
				continue
			}
			if !send(nodeClaimFrame(n, ev.Type == watch.Deleted)) {
				return
			}
		}
	}
}

func clusterFrame(c *v1alpha1.Cluster, deleted bool) cluster.SubscribeClustersCluster {
	running, blocked := c.Spec.Running, c.Status.TeardownBlocked != ""
	f := cluster.SubscribeClustersCluster{Name: c.Name, Phase: phaseOf(c), Running: &running, TeardownBlocked: &blocked}
	if deleted {
		f.Deleted = &deleted
	}
	if c.Status.Instance != "" {
		f.Instance = &c.Status.Instance
	}
	if c.Status.Server != "" {
		f.Server = &c.Status.Server
	}
	return f
}

func nodeClaimFrame(n *v1alpha1.NodeClaim, deleted bool) cluster.SubscribeClustersNodeClaim {
	f := cluster.SubscribeClustersNodeClaim{Cluster: n.Spec.ClusterRef.Name, Name: n.Name}
	if deleted {
		f.Deleted = &deleted
	}
	if n.Spec.NodeName != "" {
		f.NodeName = &n.Spec.NodeName
	}
	if n.Status.Phase != "" {
		p := string(n.Status.Phase)
		f.Phase = &p
	}
	return f
}
