package pds_test

import (
	"errors"
	"strings"
	"testing"

	"socialweb.computer/internal/pds"
)

func TestParsePublicURL(t *testing.T) {
	for _, tc := range []struct {
		in, url, crawl, err string
	}{
		{in: "https://pds.example.com", url: "https://pds.example.com", crawl: "pds.example.com"},
		{in: "https://PDS.Example.com./", url: "https://pds.example.com", crawl: "pds.example.com"},
		{in: "http://pds.test", url: "http://pds.test", crawl: "http://pds.test"},
		{in: "http://pds.localhost", url: "http://pds.localhost", crawl: "http://pds.localhost"},
		{in: "http://localhost:2583", url: "http://localhost:2583", crawl: "http://localhost:2583"},
		{in: "https://localhost:8443", url: "https://localhost:8443", crawl: "https://localhost:8443"},
		{in: "http://pds.example.com", err: "http on a public name"},
		{in: "https://203.0.113.7", err: "an IP address"},
		{in: "https://[2001:db8::1]", err: "an IP address"},
		{in: "http://127.0.0.1:2583", err: "an IP address"},
		{in: "https://pds", err: "not a DNS name of two labels"},
		{in: "https://pds_x.example.com", err: "not a DNS name"},
		{in: "https://pds.example.com:8443", err: "a port (8443)"},
		{in: "https://pds.example.com/xrpc", err: "path, query or fragment"},
		{in: "https://user@pds.example.com", err: "has a user"},
		{in: "https://pds.example.com?x=1", err: "query"},
		{in: "wss://pds.example.com", err: `scheme "wss"`},
		{in: "pds.example.com", err: "not an absolute URL"},
		{in: "", err: "not an absolute URL"},
		{in: "https://", err: "not an absolute URL"},
		{in: "://x", err: "not an absolute URL"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			u, err := pds.ParsePublicURL(tc.in)
			if tc.err != "" {
				var pe *pds.PublicURLError
				if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("got %v, want a one-line *PublicURLError with %q", err, tc.err)
				}
				return
			}
			if err != nil || u.String() != tc.url || u.CrawlHostname() != tc.crawl {
				t.Fatalf("got %q %q %v, want %q %q", u, u.CrawlHostname(), err, tc.url, tc.crawl)
			}
		})
	}
}

func TestParseRelayURL(t *testing.T) {
	for _, tc := range []struct{ in, out, err string }{
		{in: "https://relay.example.com/", out: "https://relay.example.com"},
		{in: "http://127.0.0.1:2470", out: "http://127.0.0.1:2470"},
		{in: "wss://relay.example.com", err: "a firehose URL"},
		{in: "ftp://relay.example.com", err: `scheme "ftp"`},
		{in: "relay.example.com", err: "not an absolute URL"},
		{in: "https://relay.example.com?a=b", err: "query"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			out, err := pds.ParseRelayURL(tc.in)
			if tc.err != "" {
				var re *pds.RelayURLError
				if !errors.As(err, &re) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want a *RelayURLError with %q", err, tc.err)
				}
				return
			}
			if err != nil || out != tc.out {
				t.Fatalf("got %q %v, want %q", out, err, tc.out)
			}
		})
	}
}

// TestConfigPublicURL: New refuses what cannot be published, relays without a public URL,
// and a hostname that contradicts the public URL.
func TestConfigPublicURL(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  pds.Config
		want any
	}{
		{"bad public URL", pds.Config{PublicURL: "https://203.0.113.7"}, new(*pds.PublicURLError)},
		{"hostname differs", pds.Config{PublicURL: "https://pds.example.com", Hostname: "other.example.com"}, new(*pds.PublicURLError)},
		{"relay without public URL", pds.Config{Relays: []string{"https://relay.example.com"}}, new(*pds.RelayURLError)},
		{"bad relay", pds.Config{PublicURL: "https://pds.example.com", Relays: []string{"wss://relay.example.com"}}, new(*pds.RelayURLError)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			s, err := pds.New(tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("accepted")
			}
			if !errors.As(err, tc.want) {
				t.Fatalf("got %T %v", err, err)
			}
		})
	}
}
