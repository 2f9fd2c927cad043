package bidder

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/certs"
)

func TestSecretsEndpointURL(t *testing.T) {
	for _, tc := range []struct {
		name, listening, public string
		tls                     bool
		want, refused           string
	}{
		{"loopback http", "127.0.0.1:4321", "", false, "http://127.0.0.1:4321", ""},
		{"loopback v6", "[::1]:4321", "", false, "http://[::1]:4321", ""},
		{"public address over tls", "198.51.100.7:8443", "", true, "https://198.51.100.7:8443", ""},
		{"public address over plain http", "198.51.100.7:8443", "", false, "", "serve https"},
		{"every address", "0.0.0.0:8443", "", true, "", "names no host"},
		{"every v6 address", "[::]:8443", "", true, "", "names no host"},
		{"a proxy's URL", "127.0.0.1:4321", "https://bidder.example.com", false, "https://bidder.example.com", ""},
		{"a proxy's URL with a slash", "0.0.0.0:4321", "https://bidder.example.com:8443/", false, "https://bidder.example.com:8443", ""},
		{"a public http URL", "127.0.0.1:4321", "http://bidder.example.com", false, "", "publish https"},
		{"a loopback http URL", "127.0.0.1:4321", "http://localhost:9000", false, "http://localhost:9000", ""},
		{"a path", "127.0.0.1:4321", "https://bidder.example.com/market", true, "", "want an origin"},
		{"a query", "127.0.0.1:4321", "https://bidder.example.com?x=1", true, "", "want an origin"},
		{"credentials", "127.0.0.1:4321", "https://u:p@bidder.example.com", true, "", "want an origin"},
		{"another scheme", "127.0.0.1:4321", "ftp://bidder.example.com", true, "", "want an origin"},
		{"no host", "127.0.0.1:4321", "https://", true, "", "want an origin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SecretsEndpointURL(tc.listening, tc.public, tc.tls)
			var ee *EndpointError
			switch {
			case tc.refused == "" && (err != nil || got != tc.want):
				t.Errorf("%q %v, want %q", got, err, tc.want)
			case tc.refused != "" && (!errors.As(err, &ee) || !strings.Contains(err.Error(), tc.refused)):
				t.Errorf("%q %v, want an EndpointError saying %q", got, err, tc.refused)
			}
		})
	}
}

// With a certificate the endpoint serves https, publishes an https URL, and takes a renewed
// certificate from the same files without a restart.
func TestSecretsEndpointServesTLSAndTakesARenewal(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca, caKey, err := certs.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(cn string) {
		c, k, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: cn}, Usage: x509.ExtKeyUsageServerAuth,
			IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		kp, err := certs.KeyPEM(k)
		if err != nil {
			t.Fatal(err)
		}
		// The key first: a watcher seeing the certificate alone would pair it with the old key.
		if err := os.WriteFile(keyFile+".new", kp, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(certFile+".new", certs.CertPEM(c.Raw), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(keyFile+".new", keyFile); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(certFile+".new", certFile); err != nil {
			t.Fatal(err)
		}
	}
	issue("first")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b := &Bidder{log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		cfg: Config{Listen: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile}}
	endpoint, err := b.serveSecrets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(endpoint, "https://127.0.0.1:") {
		t.Fatalf("endpoint %q, want https://127.0.0.1:PORT", endpoint)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	servedCN := func() (string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
		resp, err := c.Get(endpoint + "/xrpc/" + mk.DeliverSecretsNSID)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			return "", errors.New(resp.Status)
		}
		return resp.TLS.PeerCertificates[0].Subject.CommonName, nil
	}
	if cn, err := servedCN(); err != nil || cn != "first" {
		t.Fatalf("served %q %v, want the first certificate", cn, err)
	}
	if resp, err := http.Get("http" + strings.TrimPrefix(endpoint, "https") + "/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain http answered %s, want the TLS server's 400", resp.Status)
		}
	}
	issue("renewed")
	deadline := time.Now().Add(30 * time.Second)
	for {
		cn, err := servedCN()
		if err == nil && cn == "renewed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still served %q %v after the renewal", cn, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSecretsEndpointRefusesHalfACertificate(t *testing.T) {
	b := &Bidder{cfg: Config{Listen: "127.0.0.1:0", TLSCertFile: "tls.crt"}}
	var ee *EndpointError
	if _, err := b.serveSecrets(context.Background()); !errors.As(err, &ee) {
		t.Fatalf("%v, want an EndpointError", err)
	}
}
