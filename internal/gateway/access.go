package gateway

import (
	"fmt"
	"net/http"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
)

// Access is who the gateway serves: the DIDs of Allow, or, with Open, any DID whose
// document resolves.
type Access struct {
	Allow []string
	Open  bool
}

// access is Access as the gateway checks it.
type access struct {
	allow map[string]bool
	open  bool
}

func newAccess(a Access) (access, error) {
	out := access{allow: map[string]bool{}, open: a.Open}
	for _, d := range a.Allow {
		did, err := syntax.ParseDID(d)
		if err != nil {
			return access{}, fmt.Errorf("gateway: allowed account %q is not a DID: %v", d, err)
		}
		out.allow[did.String()] = true
	}
	return out, nil
}

// allows says whether the gateway serves did.
func (a access) allows(did string) bool { return a.open || a.allow[did] }

// notAllowed is the refusal of an account the operator did not admit; it says how the
// operator admits it.
func notAllowed(did string) *Error {
	return xrpcErr(http.StatusForbidden, ErrAccountNotAllowed,
		"account %s is not allowed on this gateway: its operator admits it with --gateway-allow %s or a GatewayAccess in namespace %s (or serves every account with --gateway-open)", did, did, AccessNamespace)
}

// checkIssuer refuses a token whose iss names an account the gateway does not serve, before
// the token is verified: a stranger's DID is never resolved (no fetch from the PLC directory,
// no did:web request to a host the stranger names). A token whose iss cannot be read goes on
// to the verifier, whose refusal says why. With Open every DID goes on.
func (a access) checkIssuer(token string) error {
	if a.open {
		return nil
	}
	var cl jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &cl); err != nil {
		return nil
	}
	did, err := syntax.ParseDID(cl.Issuer)
	if err != nil {
		return nil
	}
	if !a.allows(did.String()) {
		return notAllowed(did.String())
	}
	return nil
}
