// Package certs is the certificate plumbing the core and every tenant cluster share: an
// ECDSA P-256 authority, the leaves it signs, self-signed pairs, and PEM pairs on disk.
// P-256 throughout: an RSA-2048 key takes a quarter of a second or more to generate on a
// loaded two-core machine, on the path of every start.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"time"

	"socialweb.computer/internal/atomicfile"
)

// CAValidity is how long an authority made by NewCA is valid.
const CAValidity = 10 * 365 * 24 * time.Hour

// clockSlack backdates every certificate a little, for clocks that disagree.
const clockSlack = time.Minute

// NewCA makes a self-signed certificate authority named cn.
func NewCA(cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	return selfSign(&x509.Certificate{
		Subject:               pkix.Name{CommonName: cn},
		NotAfter:              time.Now().Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	})
}

// SelfSigned makes a serving pair for name that is its own authority: a client that trusts
// exactly this certificate can dial name. It returns PEM.
func SelfSigned(name string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	c, k, err := selfSign(&x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		DNSNames:              []string{name},
	})
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = KeyPEM(k)
	return CertPEM(c.Raw), keyPEM, err
}

func selfSign(tmpl *x509.Certificate) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-clockSlack)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return c, key, err
}

// Leaf describes a certificate for Issue to sign.
type Leaf struct {
	Subject  pkix.Name
	Usage    x509.ExtKeyUsage
	IPs      []net.IP
	DNSNames []string
	// Validity counts from now.
	Validity time.Duration
}

// Issue signs a new key's certificate for l with the authority ca.
func Issue(ca *x509.Certificate, caKey crypto.Signer, l Leaf) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      l.Subject,
		NotBefore:    now.Add(-clockSlack),
		NotAfter:     now.Add(l.Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{l.Usage},
		IPAddresses:  l.IPs,
		DNSNames:     l.DNSNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return c, key, err
}

// CoversIPs says whether c names every one of ips.
func CoversIPs(c *x509.Certificate, ips []net.IP) bool {
	for _, want := range ips {
		found := false
		for _, have := range c.IPAddresses {
			found = found || have.Equal(want)
		}
		if !found {
			return false
		}
	}
	return true
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// CertPEM encodes a certificate's DER as PEM.
func CertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// KeyPEM encodes an ECDSA key as PEM.
func KeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// LoadPair reads a PEM certificate and its ECDSA key. A missing file's error wraps
// os.ErrNotExist.
func LoadPair(crtPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
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
	c, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", crtPath, err)
	}
	k, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return c, k, nil
}

// WritePair writes a certificate (0644) and its key (0600) as PEM, each atomically; the key
// first, so a certificate on disk always has its key beside it.
func WritePair(crtPath, keyPath string, c *x509.Certificate, k *ecdsa.PrivateKey) error {
	keyPEM, err := KeyPEM(k)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(crtPath, CertPEM(c.Raw), 0o644)
}
