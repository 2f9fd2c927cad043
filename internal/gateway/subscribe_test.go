package gateway_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/gateway"
)

type frame struct {
	Type    string `json:"$type"`
	Name    string `json:"name"`
	Cluster string `json:"cluster"`
	Phase   string `json:"phase"`
	Running *bool  `json:"running"`
	Deleted bool   `json:"deleted"`
	DID     string `json:"did"`
	State   string `json:"state"`
}

func dial(t *testing.T, gw *gateway.Server, token, query string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u := "ws" + strings.TrimPrefix(gw.URL(), "http") + "/xrpc/" + cluster.SubscribeClustersNSID + query
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return websocket.DefaultDialer.Dial(u, h)
}

func next(t *testing.T, ws *websocket.Conn) frame {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, b, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("frame %s: %v", b, err)
	}
	return f
}

// subscribeClusters: a snapshot of the caller's clusters, their members and their NodeClaims,
// SnapshotComplete, then changes; nothing of another account's; refused like any call without
// a good token.
func TestSubscribeClusters(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a1"}, nil)
	f.do(t, f.b, cluster.CreateClusterNSID, name{"b1"}, nil)
	claim := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: gateway.AccountNamespace(f.a.did), Name: "a1-n1"},
		Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "a1"}, NodeName: "n1"}}
	if err := f.env.Client.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}

	for _, r := range []struct {
		name, token, want string
		status            int
	}{
		{"no token", "", gateway.ErrAuthMissing, 401},
		{"wrong lxm", f.a.token(t, f.gw.DID(), cluster.ListClustersNSID), gateway.ErrInvalidToken, 401},
	} {
		_, resp, err := dial(t, f.gw, r.token, "")
		if err == nil || resp == nil || resp.StatusCode != r.status {
			t.Errorf("%s: %v %v", r.name, resp, err)
			continue
		}
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		if e.Error != r.want {
			t.Errorf("%s: %q, want %q", r.name, e.Error, r.want)
		}
	}

	ws, _, err := dial(t, f.gw, f.a.token(t, f.gw.DID(), cluster.SubscribeClustersNSID), "")
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var snap []frame
	for {
		fr := next(t, ws)
		if fr.Type == (cluster.SubscribeClustersInfo{}).LexiconType() {
			if fr.Name != "SnapshotComplete" {
				t.Errorf("info frame %+v", fr)
			}
			break
		}
		snap = append(snap, fr)
	}
	if len(snap) != 3 || snap[0].Type != (cluster.SubscribeClustersCluster{}).LexiconType() || snap[0].Name != "a1" || snap[0].Phase != "Initializing" ||
		snap[1].Type != (cluster.SubscribeClustersMember{}).LexiconType() || snap[1].Cluster != "a1" || snap[1].DID != f.a.did || snap[1].State != "Granted" ||
		snap[2].Type != (cluster.SubscribeClustersNodeClaim{}).LexiconType() || snap[2].Name != "a1-n1" || snap[2].Cluster != "a1" {
		t.Fatalf("snapshot %+v", snap)
	}

	// Changes: B's cluster is never seen; A's new one, its stop and its deletion are.
	f.do(t, f.b, cluster.CreateClusterNSID, name{"b2"}, nil)
	f.do(t, f.a, cluster.CreateClusterNSID, name{"a2"}, nil)
	if fr := next(t, ws); fr.Name != "a2" || fr.Phase != "Initializing" || fr.Deleted {
		t.Errorf("after createCluster a2: %+v", fr)
	}
	if fr := next(t, ws); fr.Type != (cluster.SubscribeClustersMember{}).LexiconType() || fr.Cluster != "a2" || fr.DID != f.a.did || fr.State != "Granted" {
		t.Errorf("a2's owner: %+v", fr)
	}
	f.do(t, f.a, cluster.ControlPlaneDownNSID, name{"a2"}, nil)
	if fr := next(t, ws); fr.Name != "a2" || fr.Running == nil || *fr.Running {
		t.Errorf("after controlPlaneDown a2: %+v", fr)
	}
	// No controller runs here, so no finalizer holds the object: it goes at once.
	f.do(t, f.a, cluster.DeleteClusterNSID, name{"a2"}, nil)
	if fr := next(t, ws); fr.Name != "a2" || !fr.Deleted {
		t.Errorf("after deleteCluster a2: %+v", fr)
	}
	if fr := next(t, ws); fr.Type != (cluster.SubscribeClustersMember{}).LexiconType() || fr.Cluster != "a2" || fr.DID != f.a.did || !fr.Deleted {
		t.Errorf("a2's owner after deleteCluster: %+v", fr)
	}
	// revokeIdentity: the cluster changes, and its member frame says Revoked.
	f.do(t, f.a, cluster.RevokeIdentityNSID, map[string]string{"name": "a1", "did": f.a.did}, nil)
	if fr := next(t, ws); fr.Type != (cluster.SubscribeClustersCluster{}).LexiconType() || fr.Name != "a1" {
		t.Errorf("after revokeIdentity: %+v", fr)
	}
	if fr := next(t, ws); fr.Type != (cluster.SubscribeClustersMember{}).LexiconType() || fr.Cluster != "a1" || fr.DID != f.a.did || fr.State != "Revoked" || fr.Deleted {
		t.Errorf("a1's owner after revokeIdentity: %+v", fr)
	}

	// ?name= narrows to one cluster.
	ws2, _, err := dial(t, f.gw, f.a.token(t, f.gw.DID(), cluster.SubscribeClustersNSID), "?name=nothere")
	if err != nil {
		t.Fatal(err)
	}
	defer ws2.Close()
	if fr := next(t, ws2); fr.Name != "SnapshotComplete" {
		t.Errorf("snapshot of a cluster that does not exist: %+v", fr)
	}
	if _, resp, err := dial(t, f.gw, f.a.token(t, f.gw.DID(), cluster.SubscribeClustersNSID), "?name=Bad"); err == nil || resp.StatusCode != 400 {
		t.Errorf("a bad name: %v %v", resp, err)
	}

	// Closing the gateway closes the subscription.
	f.gw.Close()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := ws.ReadMessage(); !websocket.IsCloseError(err, websocket.CloseGoingAway) {
		t.Errorf("after the gateway closed: %v", err)
	}
}
