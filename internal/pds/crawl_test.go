package pds_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
)

// fakeRelay stands in for a relay's requestCrawl endpoint on 127.0.0.1 and records the
// hostnames it was asked to crawl. The first fail answers are 503.
type fakeRelay struct {
	mu        sync.Mutex
	fail      int
	hostnames []string
	got       chan string
}

func newFakeRelay(t *testing.T, fail int) (*fakeRelay, string) {
	r := &fakeRelay{fail: fail, got: make(chan string, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != "POST" || req.URL.Path != "/xrpc/com.atproto.sync.requestCrawl" {
			http.NotFound(w, req)
			return
		}
		var in struct {
			Hostname string `json:"hostname"`
		}
		if err := json.NewDecoder(req.Body).Decode(&in); err != nil {
			w.WriteHeader(400)
			return
		}
		r.mu.Lock()
		failing := r.fail > 0
		r.fail--
		r.mu.Unlock()
		if failing {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(503)
			_, _ = w.Write([]byte(`{"error":"Unavailable","message":"not now"}`))
			r.got <- "failed:" + in.Hostname
			return
		}
		r.mu.Lock()
		r.hostnames = append(r.hostnames, in.Hostname)
		r.mu.Unlock()
		r.got <- in.Hostname
	}))
	t.Cleanup(srv.Close)
	return r, srv.URL
}

func (r *fakeRelay) next(t *testing.T, within time.Duration) string {
	t.Helper()
	select {
	case h := <-r.got:
		return h
	case <-time.After(within):
		t.Fatalf("no requestCrawl within %s", within)
		return ""
	}
}

func (r *fakeRelay) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case h := <-r.got:
		t.Fatalf("unexpected requestCrawl %q", h)
	case <-time.After(d):
	}
}

// TestRequestCrawl: the PDS asks each relay to crawl its public hostname at start and after an
// account is created over XRPC, retries a relay that failed, and serves whatever the relays do.
func TestRequestCrawl(t *testing.T) {
	ctx := context.Background()
	ok, okURL := newFakeRelay(t, 0)
	flaky, flakyURL := newFakeRelay(t, 1)
	s, err := pds.New(pds.Config{DataDir: t.TempDir(), PublicURL: "https://PDS.example.com/", Relays: []string{okURL, flakyURL + "/"},
		CrawlInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	if h := ok.next(t, 5*time.Second); h != "pds.example.com" {
		t.Fatalf("at start: hostname %q, want pds.example.com", h)
	}
	if h := flaky.next(t, 5*time.Second); h != "failed:pds.example.com" {
		t.Fatalf("flaky relay at start: %q", h)
	}
	// Retried after the backoff (2 s after the first failure).
	if h := flaky.next(t, 10*time.Second); h != "pds.example.com" {
		t.Fatalf("flaky relay retry: %q", h)
	}
	ok.quiet(t, 500*time.Millisecond)

	// describeServer names the service by its public host.
	c := atclient.New(s.LocalURL())
	var desc struct {
		DID string `json:"did"`
	}
	if err := c.Call(ctx, "com.atproto.server.describeServer", nil, nil, &desc, false); err != nil || desc.DID != "did:web:pds.example.com" {
		t.Fatalf("describeServer: %+v %v", desc, err)
	}

	code, err := s.CreateInviteCode(ctx, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.CreateAccountWithInvite(ctx, "eve.test", "eve-password", "", code)
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*fakeRelay{"ok": ok, "flaky": flaky} {
		if h := r.next(t, 10*time.Second); h != "pds.example.com" {
			t.Fatalf("%s relay after createAccount: hostname %q", name, h)
		}
	}

	// Activation (the last step of moving an account here) asks again.
	if err := s.DeactivateAccount(ctx, sess.DID); err != nil {
		t.Fatal(err)
	}
	if err := s.ActivateAccount(ctx, sess.DID); err != nil {
		t.Fatal(err)
	}
	if h := ok.next(t, 10*time.Second); h != "pds.example.com" {
		t.Fatalf("relay after activateAccount: hostname %q", h)
	}

	// The new account's DID document points at the public URL.
	doc, err := s.Directory().LookupDID(ctx, syntax.DID(sess.DID))
	if err != nil {
		t.Fatal(err)
	}
	if ep := doc.PDSEndpoint(); ep != "https://pds.example.com" {
		t.Fatalf("#atproto_pds of a new account: %q", ep)
	}
}

// TestPublicURLMovesExistingAccounts: an account made before a public URL was set has its
// #atproto_pds endpoint moved to it by a PLC operation at the next start.
func TestPublicURLMovesExistingAccounts(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := startPDS(t, dir)
	did, err := s.CreateAccount(ctx, "old.test", "old-password")
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = pds.New(pds.Config{DataDir: dir, PublicURL: "https://pds.example.com", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	doc, err := s.Directory().LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatal(err)
	}
	if ep := doc.PDSEndpoint(); ep != "https://pds.example.com" {
		t.Fatalf("#atproto_pds of an existing account: %q", ep)
	}
}
