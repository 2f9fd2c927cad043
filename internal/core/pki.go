package core

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/certs"
)

// pki is the core's certificate authority and serving certificate, kept in the data dir so a
// kubeconfig written by one start stays valid after the next.
type pki struct {
	CAPEM      []byte
	ServingCrt string
	ServingKey string
}

const (
	servingValidity = 365 * 24 * time.Hour
	renewBefore     = 30 * 24 * time.Hour
)

// ensurePKI loads the CA and serving pair from dir, creating what is missing and renewing a
// serving certificate that is close to expiry or does not cover the serving IPs.
func ensurePKI(dir string, ips []net.IP) (*pki, error) {
	caCrtPath, caKeyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	srvCrtPath, srvKeyPath := filepath.Join(dir, "serving.crt"), filepath.Join(dir, "serving.key")

	caCert, caKey, err := certs.LoadPair(caCrtPath, caKeyPath)
	if errors.Is(err, os.ErrNotExist) {
		caCert, caKey, err = certs.NewCA("socialweb-core-ca")
		if err == nil {
			err = certs.WritePair(caCrtPath, caKeyPath, caCert, caKey)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("certificate authority in %s: %w", dir, err)
	}

	srv, _, err := certs.LoadPair(srvCrtPath, srvKeyPath)
	if err != nil || time.Until(srv.NotAfter) < renewBefore || !certs.CoversIPs(srv, ips) || srv.CheckSignatureFrom(caCert) != nil {
		crt, key, err := certs.Issue(caCert, caKey, certs.Leaf{
			Subject: pkix.Name{CommonName: "socialweb-core"}, Usage: x509.ExtKeyUsageServerAuth,
			IPs: ips, DNSNames: []string{"localhost"}, Validity: servingValidity,
		})
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		if err := certs.WritePair(srvCrtPath, srvKeyPath, crt, key); err != nil {
			return nil, err
		}
	}
	return &pki{
		CAPEM:      certs.CertPEM(caCert.Raw),
		ServingCrt: srvCrtPath,
		ServingKey: srvKeyPath,
	}, nil
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
	if err := atomicfile.Write(path, []byte(s), 0o600); err != nil {
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
