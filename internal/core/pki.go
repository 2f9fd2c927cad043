package core

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the core's certificate authority and serving certificate, kept in the data dir so a
// kubeconfig written by one start stays valid after the next.
type pki struct {
	CAPEM      []byte
	ServingCrt string
	ServingKey string
}

const (
	caValidity      = 10 * 365 * 24 * time.Hour
	servingValidity = 365 * 24 * time.Hour
	renewBefore     = 30 * 24 * time.Hour
)

// ensurePKI loads the CA and serving pair from dir, creating what is missing and renewing a
// serving certificate that is close to expiry or does not cover the serving IPs.
func ensurePKI(dir string, ips []net.IP) (*pki, error) {
	caCrtPath, caKeyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	srvCrtPath, srvKeyPath := filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")

	caCert, caKey, err := loadPair(caCrtPath, caKeyPath)
	if errors.Is(err, os.ErrNotExist) {
		caCert, caKey, err = newCA()
		if err == nil {
			err = writePair(caCrtPath, caKeyPath, caCert, caKey)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("certificate authority in %s: %w", dir, err)
	}

	srv, _, err := loadPair(srvCrtPath, srvKeyPath)
	if err != nil || time.Until(srv.NotAfter) < renewBefore || !coversIPs(srv, ips) || srv.CheckSignatureFrom(caCert) != nil {
		crt, key, err := newServing(caCert, caKey, ips)
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		if err := writePair(srvCrtPath, srvKeyPath, crt, key); err != nil {
			return nil, err
		}
	}
	return &pki{
		CAPEM:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw}),
		ServingCrt: srvCrtPath,
		ServingKey: srvKeyPath,
	}, nil
}

func coversIPs(c *x509.Certificate, ips []net.IP) bool {
	for _, want := range ips {
		found := false
		for _, have := range c.IPAddresses {
			if have.Equal(want) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func newCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "socialweb-core-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

func newServing(ca *x509.Certificate, caKey *ecdsa.PrivateKey, ips []net.IP) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "socialweb-core"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(servingValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

// loopbackPair is a self-signed serving pair for name, the server name under which the API
// server's in-process client dials it and which that client alone trusts. It lives in memory
// for one start.
func loopbackPair(name string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(caValidity), // outlives any one process
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{name},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func loadPair(crtPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crtPEM, err := os.ReadFile(crtPath)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, err
	}
	cb, _ := pem.Decode(crtPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", crtPath, keyPath)
	}
	crt, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crtPath, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return crt, key, nil
}

func writePair(crtPath, keyPath string, crt *x509.Certificate, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return writeFileAtomic(crtPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: crt.Raw}), 0o644)
}

// ensureSecretFile returns the content of path, creating it with n random bytes (base64)
// when absent. Used for the admin token and the encryption key.
func ensureSecretFile(path string, n int) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if len(b) == 0 {
			return "", fmt.Errorf("%s is empty; remove it to have a new one made", path)
		}
		return string(b), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw := make([]byte, n)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	s := base64.RawURLEncoding.EncodeToString(raw)
	if err := writeFileAtomic(path, []byte(s), 0o600); err != nil {
		return "", err
	}
	return s, nil
}

func randomKey32() (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(raw), nil
}
