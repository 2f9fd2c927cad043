package kube

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/klog/v2"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"

	"socialweb.computer/internal/tenant"
)

// revokedNodeAuthenticator refuses, after the apiserver's own authenticators accepted a
// request, the identity of a node whose claim was released (tenant.RevokedNodes.Refuse): a
// client certificate cannot be revoked in kube-apiserver, and every certificate a node ever
// held (its join bundle's, its renewals through the CSR API) names it. The answer is 401,
// before the Node authorizer and NodeRestriction are asked anything, so the node can neither
// read, nor register its Node again, nor request a certificate.
type revokedNodeAuthenticator struct {
	inner   authenticator.Request
	revoked *tenant.RevokedNodesFile
}

func (a *revokedNodeAuthenticator) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	resp, ok, err := a.inner.AuthenticateRequest(req)
	if !ok || err != nil || resp == nil || resp.User == nil {
		return resp, ok, err
	}
	if refuse, why := a.revoked.Refuse(tenant.NodeIdentity{User: resp.User.GetName(), Groups: resp.User.GetGroups()}); refuse {
		return nil, false, errors.New(why)
	}
	return resp, ok, err
}

// nodeRequests ends the requests a node has open (watches, exec, logs) once it is revoked:
// authentication is asked once per request, and a watch opened before the release would
// otherwise keep streaming.
type nodeRequests struct {
	revoked *tenant.RevokedNodesFile

	mu   sync.Mutex
	open map[string]map[*context.CancelFunc]struct{} // by node name
}

// wrap is the innermost filter of the handler chain: the request's user is known there.
func (n *nodeRequests) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, ok := genericapirequest.UserFrom(req.Context())
		if !ok {
			h.ServeHTTP(w, req)
			return
		}
		name, isNode := strings.CutPrefix(u.GetName(), tenant.NodeUserPrefix)
		if !isNode || name == "" {
			h.ServeHTTP(w, req)
			return
		}
		ctx, cancel := context.WithCancel(req.Context())
		n.mu.Lock()
		if n.open[name] == nil {
			n.open[name] = map[*context.CancelFunc]struct{}{}
		}
		n.open[name][&cancel] = struct{}{}
		n.mu.Unlock()
		defer func() {
			n.mu.Lock()
			delete(n.open[name], &cancel)
			if len(n.open[name]) == 0 {
				delete(n.open, name)
			}
			n.mu.Unlock()
			cancel()
		}()
		h.ServeHTTP(w, req.WithContext(ctx))
	})
}

// run ends the open requests of revoked nodes, looking every interval until ctx ends.
func (n *nodeRequests) run(ctx context.Context, interval time.Duration) {
	wait.UntilWithContext(ctx, func(context.Context) { n.endRevoked() }, interval)
}

// endRevoked ends the open requests of every node revoked by now.
func (n *nodeRequests) endRevoked() {
	n.mu.Lock()
	var ended []string
	for name, reqs := range n.open {
		if n.revoked.Revoked(name) {
			for c := range reqs {
				(*c)()
			}
			ended = append(ended, name)
		}
	}
	n.mu.Unlock()
	for _, name := range ended {
		klog.InfoS("ended the open requests of a released node", "node", name)
	}
}

// applyRevokedNodes wraps the authenticator of every server of the chain (as
// applyTokenPolicy) and the aggregator's handler chain, which serves the requests, with the
// revoked nodes of file; the open requests of a node are ended within a quarter second of
// its revocation. No file (a spec of an older manager): nothing is wrapped.
func applyRevokedNodes(ctx context.Context, config *apiserverapp.Config, file string) {
	if file == "" {
		return
	}
	revoked := tenant.NewRevokedNodesFile(file)
	for _, g := range []*genericapiserver.Config{config.KubeAPIs.ControlPlane.Generic, &config.ApiExtensions.GenericConfig.Config, &config.Aggregator.GenericConfig.Config} {
		if g.Authentication.Authenticator != nil {
			g.Authentication.Authenticator = &revokedNodeAuthenticator{inner: g.Authentication.Authenticator, revoked: revoked}
		}
	}
	reqs := &nodeRequests{revoked: revoked, open: map[string]map[*context.CancelFunc]struct{}{}}
	agg := &config.Aggregator.GenericConfig.Config
	build := agg.BuildHandlerChainFunc
	agg.BuildHandlerChainFunc = func(h http.Handler, c *genericapiserver.Config) http.Handler {
		return build(reqs.wrap(h), c)
	}
	go reqs.run(ctx, 250*time.Millisecond)
}
