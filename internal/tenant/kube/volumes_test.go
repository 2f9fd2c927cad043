package kube

import (
	"net/http"
	"testing"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
)

type fixedAuthenticator struct{ name string }

func (f fixedAuthenticator) AuthenticateRequest(*http.Request) (*authenticator.Response, bool, error) {
	return &authenticator.Response{User: &user.DefaultInfo{Name: f.name}}, true, nil
}

// Only the in-process token gets the provisioner's proof; any other request is the inner
// authenticator's, whatever it claims to be.
func TestProvisionerAuthenticator(t *testing.T) {
	s, err := newProvisionerSecrets()
	if err != nil {
		t.Fatal(err)
	}
	a := &provisionerAuthenticator{inner: fixedAuthenticator{name: "did:plc:owner"}, secrets: s}
	for _, tc := range []struct {
		header    string
		wantProof bool
	}{
		{"Bearer " + s.token, true},
		{"Bearer " + s.proof, false},
		{"Bearer x" + s.token, false},
		{"", false},
	} {
		req, _ := http.NewRequest("GET", "https://127.0.0.1/api", nil)
		if tc.header != "" {
			req.Header.Set("Authorization", tc.header)
		}
		resp, ok, err := a.AuthenticateRequest(req)
		if !ok || err != nil {
			t.Fatalf("%q: %v %v", tc.header, ok, err)
		}
		if got := hasProof(resp.User, s.proof); got != tc.wantProof {
			t.Errorf("%q: user %s proof %v, want %v", tc.header, resp.User.GetName(), got, tc.wantProof)
		}
	}
	if s2, _ := newProvisionerSecrets(); s2.token == s.token || s2.proof == s.proof || s.token == s.proof {
		t.Error("secrets repeat")
	}
}

func TestFlagValue(t *testing.T) {
	args := []string{"--config", "c.yaml", "--kubeconfig=/k", "--hostname-override", "node-a", "--cert-dir"}
	if flagValue(args, "kubeconfig") != "/k" || flagValue(args, "hostname-override") != "node-a" || flagValue(args, "cert-dir") != "" || flagValue(args, "root-dir") != "" {
		t.Errorf("flagValue: %q %q", flagValue(args, "kubeconfig"), flagValue(args, "hostname-override"))
	}
}
