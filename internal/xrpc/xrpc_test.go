package xrpc

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestWriteError(t *testing.T) {
	for _, tc := range []struct {
		name             string
		err              error
		status           int
		body, retryAfter string
	}{
		{"named", Errorf(400, InvalidRequest, "bad %s", "cursor"), 400, `{"error":"InvalidRequest","message":"bad cursor"}`, ""},
		{"wrapped", fmt.Errorf("ctx: %w", Errorf(403, "Forbidden", "no")), 403, `{"error":"Forbidden","message":"no"}`, ""},
		{"other error keeps its text out", errors.New("open /secret/path: denied"), 500, `{"error":"InternalServerError","message":"Internal Server Error"}`, ""},
		{"retry after rounds up", &Error{Status: 429, Name: RateLimitExceeded, Message: "slow down", RetryAfter: 1500 * time.Millisecond}, 429, `{"error":"RateLimitExceeded","message":"slow down"}`, "2"},
		{"retry after at least 1", &Error{Status: 429, Name: RateLimitExceeded, RetryAfter: time.Millisecond}, 429, `{"error":"RateLimitExceeded","message":""}`, "1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			WriteError(w, tc.err)
			if w.Code != tc.status {
				t.Errorf("status %d, want %d", w.Code, tc.status)
			}
			if got := w.Body.String(); got != tc.body+"\n" {
				t.Errorf("body %s, want %s", got, tc.body)
			}
			if got := w.Header().Get("Content-Type"); got != "application/json; charset=utf-8" {
				t.Errorf("Content-Type %q", got)
			}
			if got := w.Header().Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, &Error{Status: 429, Name: RateLimitExceeded, Message: "m", RetryAfter: 3 * time.Second})
	got, ok := Decode(w.Code, w.Header(), w.Body.Bytes())
	if !ok || *got != (Error{Status: 429, Name: RateLimitExceeded, Message: "m", RetryAfter: 3 * time.Second}) {
		t.Fatalf("Decode of a written error = %+v, %v", got, ok)
	}
	for _, raw := range []string{``, `not json`, `{}`, `{"message":"no name"}`, `{"error":""}`, `[1]`} {
		if e, ok := Decode(500, http.Header{}, []byte(raw)); ok {
			t.Errorf("Decode(%q) = %+v, want not an XRPC error", raw, e)
		}
	}
	var b map[string]string
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || len(b) != 2 {
		t.Errorf("wire body %s: want exactly error and message", w.Body)
	}
}

func TestBearerToken(t *testing.T) {
	for _, tc := range []struct {
		authz, tok string
		err        error
	}{
		{"Bearer abc.def.ghi", "abc.def.ghi", nil},
		{"bearer abc", "abc", nil},
		{"Bearer   abc  ", "abc", nil},
		{"", "", ErrNoAuthorization},
		{"Bearer", "", ErrNotBearer},
		{"Bearer ", "", ErrNotBearer},
		{"Bearer    ", "", ErrNotBearer},
		{"Basic dXNlcjpwdw==", "", ErrNotBearer},
		{"Bearerabc", "", ErrNotBearer},
		{"DPoP abc", "", ErrNotBearer},
	} {
		tok, err := BearerToken(tc.authz)
		if tok != tc.tok || !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", tc.authz, tok, err, tc.tok, tc.err)
		}
	}
}
