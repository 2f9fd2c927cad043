package core

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// limitLargeBodies lets n large bodies through at once, holds the next one back before its
// body is read, lets small bodies and bodiless requests pass, and answers 429 to a request
// whose deadline passes while it waits.
func TestLimitLargeBodies(t *testing.T) {
	release := make(chan struct{})
	var inside atomic.Int32
	h := limitLargeBodies(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside.Add(1)
		defer inside.Add(-1)
		if r.Header.Get("X-Hold") != "" {
			<-release
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}), 2)
	large := strings.Repeat("x", largeBodyBytes+1)
	serve := func(ctx context.Context, body io.Reader, hold bool) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/apis/socialweb.computer/v1alpha1/namespaces/default/infras", body)
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	done := make(chan int, 3)
	for range 2 {
		go func() { done <- serve(context.Background(), strings.NewReader(large), true).Code }()
	}
	waitFor := func(n int32) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); inside.Load() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d requests inside, want %d", inside.Load(), n)
			}
		}
	}
	waitFor(2)
	// A third large body, of unknown length this time, waits.
	go func() {
		req := httptest.NewRequest(http.MethodPost, "/apis/socialweb.computer/v1alpha1/namespaces/default/infras", io.NopCloser(strings.NewReader(large)))
		req.ContentLength = -1
		req.Header.Set("X-Hold", "1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		done <- rec.Code
	}()
	time.Sleep(50 * time.Millisecond)
	if n := inside.Load(); n != 2 {
		t.Fatalf("%d requests inside with two large bodies held, want 2", n)
	}
	// Small bodies and requests without one pass.
	if code := serve(context.Background(), strings.NewReader(`{"kind":"Infra"}`), false).Code; code != http.StatusCreated {
		t.Errorf("small body: %d, want 201", code)
	}
	if code := serve(context.Background(), nil, false).Code; code != http.StatusCreated {
		t.Errorf("no body: %d, want 201", code)
	}
	// A large body whose deadline passes while it waits is answered 429.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if rec := serve(ctx, strings.NewReader(large), false); rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" ||
		!strings.Contains(rec.Body.String(), "large request bodies") {
		t.Errorf("waiting past the deadline: %d %q %q, want 429 with a Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	close(release)
	for range 3 {
		if code := <-done; code != http.StatusCreated {
			t.Errorf("large body: %d, want 201", code)
		}
	}
}
