package kube

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"

	"socialweb.computer/internal/tenant"
)

// revocationAuthenticator refuses, after the apiserver's own authenticators accepted a
// request, a token the cluster's TokenPolicy revokes: a denied credential, or a
// service-account token of a retired key that is not a pod's (tenant.TokenPolicy.Refuse).
// kube-apiserver has no deny list for tokens and no notion of a key kept only for pods'
// tokens; this is the one place both are checked, for every request and for TokenReview.
type revocationAuthenticator struct {
	inner  authenticator.Request
	policy tenant.TokenPolicy
	now    func() time.Time
}

func (a *revocationAuthenticator) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	kid := tenant.RequestKeyID(req.Header)
	resp, ok, err := a.inner.AuthenticateRequest(req)
	if !ok || err != nil || resp == nil || resp.User == nil {
		return resp, ok, err
	}
	u := resp.User
	extra := u.GetExtra()
	tok := tenant.AuthenticatedToken{
		KeyID:          kid,
		CredentialIDs:  extra[user.CredentialIDKey],
		ServiceAccount: kid != "" && strings.HasPrefix(u.GetName(), serviceaccount.ServiceAccountUsernamePrefix),
		PodBound:       len(extra[serviceaccount.PodUIDKey]) > 0,
	}
	if refuse, why := a.policy.Refuse(tok, a.now()); refuse {
		return nil, false, errors.New(why)
	}
	return resp, ok, err
}

// applyTokenPolicy wraps the authenticator of every server of the chain (the aggregator
// serves the requests; the others keep copies of the configuration made before).
func applyTokenPolicy(config *apiserverapp.Config, p tenant.TokenPolicy) {
	if len(p.DeniedCredentials) == 0 && p.CurrentKeyID == "" {
		return
	}
	for _, g := range []*genericapiserver.Config{config.KubeAPIs.ControlPlane.Generic, &config.ApiExtensions.GenericConfig.Config, &config.Aggregator.GenericConfig.Config} {
		if g.Authentication.Authenticator != nil {
			g.Authentication.Authenticator = &revocationAuthenticator{inner: g.Authentication.Authenticator, policy: p, now: time.Now}
		}
	}
}
