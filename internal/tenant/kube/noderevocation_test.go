package kube

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"socialweb.computer/internal/tenant"
)

// writeRevoked writes the revoked-nodes.json the manager writes, with names.
func writeRevoked(t *testing.T, path string, names ...string) {
	t.Helper()
	var set tenant.RevokedNodes
	for _, n := range names {
		set.Nodes = append(set.Nodes, tenant.RevokedNode{Name: n, RevokedAt: time.Now()})
	}
	b, _ := json.Marshal(set)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The authenticator the apiserver's are wrapped in: a revoked node's identity is refused
// once the file names it, any other passes as the inner authenticator answered.
func TestRevokedNodeAuthenticator(t *testing.T) {
	path := filepath.Join(t.TempDir(), "revoked-nodes.json")
	var as user.Info
	a := &revokedNodeAuthenticator{revoked: tenant.NewRevokedNodesFile(path),
		inner: authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
			if as == nil {
				return nil, false, nil
			}
			return &authenticator.Response{User: as}, true, nil
		})}
	node := &user.DefaultInfo{Name: "system:node:node-aa", Groups: []string{"system:nodes"}}
	other := &user.DefaultInfo{Name: "system:node:node-bb", Groups: []string{"system:nodes"}}
	member := &user.DefaultInfo{Name: "did:plc:owner"}
	req := httptest.NewRequest(http.MethodGet, "/api/v1/nodes", nil)
	check := func(when string, u user.Info, want bool) {
		t.Helper()
		as = u
		resp, ok, err := a.AuthenticateRequest(req)
		if ok != want || (ok && resp.User.GetName() != u.GetName()) || (!want && u != nil && err == nil) {
			t.Errorf("%s, %v: ok %v err %v, want %v", when, u, ok, err, want)
		}
	}
	check("before", node, true)
	check("before", nil, false)
	writeRevoked(t, path, "node-aa")
	check("revoked", node, false)
	check("revoked", other, true)
	check("revoked", member, true)
	check("revoked", nil, false)
}

// A request a node has open (a watch) ends once the node is revoked; another node's does
// not.
func TestNodeRequestsEndAtRevocation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "revoked-nodes.json")
	reqs := &nodeRequests{revoked: tenant.NewRevokedNodesFile(path), open: map[string]map[*context.CancelFunc]struct{}{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go reqs.run(ctx, 10*time.Millisecond)
	ended := make(chan string, 2)
	h := reqs.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		u, _ := genericapirequest.UserFrom(r.Context())
		ended <- u.GetName()
	}))
	serve := func(name string) {
		r := httptest.NewRequest(http.MethodGet, "/api/v1/nodes?watch=1", nil)
		r = r.WithContext(genericapirequest.WithUser(ctx, &user.DefaultInfo{Name: name, Groups: []string{"system:nodes"}}))
		go h.ServeHTTP(httptest.NewRecorder(), r)
	}
	serve("system:node:node-aa")
	serve("system:node:node-bb")
	time.Sleep(50 * time.Millisecond)
	select {
	case n := <-ended:
		t.Fatalf("%s's request ended before any revocation", n)
	default:
	}
	writeRevoked(t, path, "node-aa")
	select {
	case n := <-ended:
		if n != "system:node:node-aa" {
			t.Fatalf("%s's request ended, want node-aa's", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked node's open request did not end")
	}
	select {
	case n := <-ended:
		t.Fatalf("%s's request ended too", n)
	case <-time.After(100 * time.Millisecond):
	}
}
