package computecontract

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A delivery that cannot be made safely fails before any token is minted or byte is sent
// (the repo is nil: touching it would panic).
func TestDeliverSecretsRefusesUnsafeEndpoints(t *testing.T) {
	vals := map[string][]byte{"token": []byte("value-never-in-an-error")}
	for _, tc := range []struct{ endpoint, want string }{
		{"", "no http(s) endpointUrl"},
		{"ftp://127.0.0.1:1", "no http(s) endpointUrl"},
		{"http://", "no http(s) endpointUrl"},
		{"://bad", "no http(s) endpointUrl"},
		{"http://bidder.example.com", "plain http"},
		{"http://10.0.0.1:8080", "plain http"},
	} {
		err := deliverSecrets(context.Background(), nil, tc.endpoint, "did:plc:winner", "at://did:plc:me/x/1", vals)
		var de *DeliveryError
		if !errors.As(err, &de) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a DeliveryError saying %q", tc.endpoint, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "value-never") {
			t.Errorf("%q: the value in the error", tc.endpoint)
		}
	}
}
