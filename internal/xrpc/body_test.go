package xrpc

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestLimitBody(t *testing.T) {
	for _, tc := range []struct {
		name     string
		body     string
		length   int64 // -1: unknown (chunked)
		wantNow  bool  // refused before any read
		wantRead bool  // refused when read
	}{
		{"within", "abcd", 4, false, false},
		{"declared over", strings.Repeat("x", 9), 9, true, false},
		{"chunked within", "abcd", -1, false, false},
		{"chunked over", strings.Repeat("x", 9), -1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/xrpc/x", strings.NewReader(tc.body))
			r.ContentLength = tc.length
			w := httptest.NewRecorder()
			xe := LimitBody(w, r, 8)
			if (xe != nil) != tc.wantNow {
				t.Fatalf("LimitBody = %v, want refused %v", xe, tc.wantNow)
			}
			if xe != nil {
				if xe.Status != http.StatusRequestEntityTooLarge || xe.Name != PayloadTooLarge || !strings.Contains(xe.Message, "8") {
					t.Errorf("answer %+v, want 413 PayloadTooLarge naming the limit", xe)
				}
				return
			}
			_, err := io.ReadAll(r.Body)
			got := BodyTooLarge(err)
			if (got != nil) != tc.wantRead {
				t.Fatalf("read: %v -> %v, want refused %v", err, got, tc.wantRead)
			}
			if got != nil && (got.Status != http.StatusRequestEntityTooLarge || got.Name != PayloadTooLarge) {
				t.Errorf("answer %+v, want 413 PayloadTooLarge", got)
			}
		})
	}
}
