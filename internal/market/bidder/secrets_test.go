package bidder

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	mk "socialweb.computer/internal/atproto/market"
)

// The refusals deliverSecrets answers before it reads a token or a body: named XRPC errors
// with the status a requester branches on.
func TestDeliverRefusalsOnTheWire(t *testing.T) {
	b := &Bidder{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, tc := range []struct {
		name, method, authz string
		status              int
		body                string
	}{
		{"query", http.MethodGet, "", 405, `{"error":"InvalidRequest","message":"` + mk.DeliverSecretsNSID + ` is a procedure: POST it"}`},
		{"no token", http.MethodPost, "", 401, `{"error":"AuthMissing","message":"a service-auth token from the contract's requester is required (Authorization: Bearer)"}`},
		{"empty bearer", http.MethodPost, "Bearer  ", 401, `{"error":"AuthMissing","message":"a service-auth token from the contract's requester is required (Authorization: Bearer)"}`},
		{"basic", http.MethodPost, "Basic dXNlcjpwdw==", 401, `{"error":"AuthMissing","message":"a service-auth token from the contract's requester is required (Authorization: Bearer)"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "/xrpc/"+mk.DeliverSecretsNSID, strings.NewReader("{}"))
			if tc.authz != "" {
				req.Header.Set("Authorization", tc.authz)
			}
			w := httptest.NewRecorder()
			b.handleDeliver(w, req)
			if w.Code != tc.status || strings.TrimSpace(w.Body.String()) != tc.body {
				t.Errorf("%d %s, want %d %s", w.Code, w.Body, tc.status, tc.body)
			}
		})
	}
}
