package certs

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestIssue_LeafVerifiesAgainstItsAuthorityOnly(t *testing.T) {
	ca, caKey, err := NewCA("test-ca")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := NewCA("other-ca")
	if err != nil {
		t.Fatal(err)
	}
	leaf, _, err := Issue(ca, caKey, Leaf{Subject: pkix.Name{CommonName: "srv"}, Usage: x509.ExtKeyUsageServerAuth,
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := leaf.CheckSignatureFrom(ca); err != nil {
		t.Errorf("leaf does not verify against its CA: %v", err)
	}
	if err := leaf.CheckSignatureFrom(other); err == nil {
		t.Error("leaf verifies against another CA")
	}
	if d := time.Until(leaf.NotAfter); d > time.Hour || d < 59*time.Minute {
		t.Errorf("leaf valid for %s more, want about an hour", d)
	}
}

func TestCoversIPs(t *testing.T) {
	c := &x509.Certificate{IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")}}
	for _, tc := range []struct {
		ips  []string
		want bool
	}{
		{nil, true},
		{[]string{"127.0.0.1"}, true},
		{[]string{"10.0.0.1", "127.0.0.1"}, true},
		{[]string{"127.0.0.2"}, false},
		{[]string{"127.0.0.1", "10.0.0.2"}, false},
	} {
		var ips []net.IP
		for _, s := range tc.ips {
			ips = append(ips, net.ParseIP(s))
		}
		if got := CoversIPs(c, ips); got != tc.want {
			t.Errorf("CoversIPs(%v) = %v, want %v", tc.ips, got, tc.want)
		}
	}
}

func TestSelfSigned_ServesTLSForItsNameToAClientTrustingOnlyIt(t *testing.T) {
	certPEM, keyPEM, err := SelfSigned("loopback-name", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "loopback-name", Roots: roots}); err != nil {
		t.Errorf("does not verify for its name: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "other-name", Roots: roots}); err == nil {
		t.Error("verifies for another name")
	}
}

func TestWritePair_LoadPairRoundTripsAndMissingIsNotExist(t *testing.T) {
	dir := t.TempDir()
	crt, key := filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key")
	if _, _, err := LoadPair(crt, key); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing pair: %v, want os.ErrNotExist", err)
	}
	ca, caKey, err := NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePair(crt, key, ca, caKey); err != nil {
		t.Fatal(err)
	}
	c, k, err := LoadPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Equal(ca) || !k.Equal(caKey) {
		t.Error("the pair read back differs from the one written")
	}
	if fi, _ := os.Stat(key); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", fi.Mode().Perm())
	}
	if err := os.WriteFile(crt, []byte("not pem"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadPair(crt, key); err == nil {
		t.Error("a certificate file that is not PEM loads")
	}
}
