package pds

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// manualClock is a clock the test moves.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *manualClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// startTestServer starts a server in a new directory, on clock's time when it is not nil,
// and closes it when the test ends.
func startTestServer(t *testing.T, clock *manualClock) *Server {
	t.Helper()
	var cfg Config
	if clock != nil {
		cfg.Clock = clock.Now
	}
	return StartForTest(t, cfg)
}

// StartForTest (for the package's external tests too) starts a server with cfg, in a new
// directory unless cfg.DataDir names one, logging nowhere, and closes it when the test ends.
func StartForTest(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testAccount creates handle (password "pw") on s and returns its DID and an access token.
func testAccount(t *testing.T, s *Server, handle string) (did, access string) {
	t.Helper()
	did, err := s.CreateAccount(context.Background(), handle, "pw")
	if err != nil {
		t.Fatal(err)
	}
	if access, _, err = s.issueSession(did); err != nil {
		t.Fatal(err)
	}
	return did, access
}
