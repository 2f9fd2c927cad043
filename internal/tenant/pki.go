package tenant

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"socialweb.computer/internal/certs"
)

// A tenant cluster's PKI, kept in its directory so that certificates and kubeconfigs stay
// valid across restarts of its control plane:
//
//	ca.crt/key            the cluster CA: signs the serving certificate and every client certificate
//	apiserver.crt/key     serving: SANs 127.0.0.1, the advertise IP, the first service IP, kubernetes.default...
//	sa.key/pub            service-account token signing pair (ECDSA P-256, ES256 tokens)
//	admin.crt/key         system:masters, used by the Cluster controller
//	controller-manager.crt/key, scheduler.crt/key
//	apiserver-kubelet-client.crt/key   the apiserver's identity towards kubelets
//	front-proxy-ca.crt/key             a CA of its own for the aggregation layer's client
//	front-proxy-client.crt/key         the apiserver's identity towards aggregated API servers
//
// The front-proxy pair is what kubeadm's is: an aggregated API server (a tenant's pod) trusts
// the requestheader CA published in kube-system/extension-apiserver-authentication and takes
// the user from the X-Remote-* headers of a request signed by it. It has a CA of its own, not
// the cluster CA, so that no client certificate the cluster CA signs (an owner's, a node's)
// can assert a user to those servers; the apiserver accepts the headers only from the name
// FrontProxyClientName, and the key never leaves the control plane's directory.
const (
	leafValidity   = 365 * 24 * time.Hour
	leafRenewAfter = 300 * 24 * time.Hour
)

// PKI is the loaded CA of one tenant cluster.
type PKI struct {
	Dir   string
	CA    *x509.Certificate
	CAKey crypto.Signer
	CAPEM []byte
}

// ClientIdentity is a client certificate's user and groups.
type ClientIdentity struct {
	File   string // base name in the PKI dir
	User   string
	Groups []string
}

// ComponentIdentities are the client certificates the control plane itself uses.
var ComponentIdentities = []ClientIdentity{
	{File: "admin", User: "socialweb:cluster-controller", Groups: []string{"system:masters"}},
	// The controller-manager runs every controller under this one identity
	// (--use-service-account-credentials=false): per-controller ServiceAccounts cost ~40
	// ServiceAccounts and token requests on the path of every fresh start (measured 6.6-6.8 s
	// to a usable cluster against 3.3-5.1 s without). It runs inside the control plane's own
	// process, next to the admin certificate, so a narrower identity would guard nothing.
	{File: "controller-manager", User: "system:kube-controller-manager", Groups: []string{"system:masters"}},
	{File: "scheduler", User: "system:kube-scheduler"},
	{File: "apiserver-kubelet-client", User: APIServerKubeletClientUser, Groups: []string{"kubeadm:cluster-admins"}},
}

// EnsurePKI loads the PKI in dir, creating whatever is missing, and (re)issuing the serving
// certificate when it does not cover ips or is close to expiry.
func EnsurePKI(dir string, ips []net.IP, dnsNames []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	crt, key, err := p.loadOrCreateCA("ca", "socialweb-tenant-ca")
	if err != nil {
		return nil, fmt.Errorf("tenant CA in %s: %w", dir, err)
	}
	p.CA, p.CAKey = crt, key
	p.CAPEM = certs.CertPEM(crt.Raw)

	if c, _, err := loadPair(p.path("apiserver")); err != nil || stale(c, p.CA) || !certs.CoversIPs(c, ips) {
		c, k, err := p.issue(pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth, ips, dnsNames, leafValidity)
		if err != nil {
			return nil, err
		}
		if err := writePair(p.path("apiserver"), c, k); err != nil {
			return nil, err
		}
	}
	for _, id := range ComponentIdentities {
		if c, _, err := loadPair(p.path(id.File)); err == nil && !stale(c, p.CA) && c.Subject.CommonName == id.User && slices.Equal(c.Subject.Organization, id.Groups) {
			continue
		}
		c, k, err := p.issue(pkix.Name{CommonName: id.User, Organization: id.Groups}, x509.ExtKeyUsageClientAuth, nil, nil, leafValidity)
		if err != nil {
			return nil, err
		}
		if err := writePair(p.path(id.File), c, k); err != nil {
			return nil, err
		}
	}
	if err := ensureFrontProxy(p); err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "sa.key")); errors.Is(err, os.ErrNotExist) {
		if err := writeServiceAccountKey(dir); err != nil {
			return nil, err
		}
	} else if err := ensureServiceAccountPub(dir); err != nil {
		return nil, err
	}
	return p, nil
}

// FrontProxyClientName is the common name of the aggregation layer's client certificate, the
// one name --requestheader-allowed-names admits.
const FrontProxyClientName = "front-proxy-client"

// ensureFrontProxy keeps the front-proxy CA and its client pair, reissuing the client when it
// is stale or not signed by the CA on disk.
func ensureFrontProxy(p *PKI) error {
	ca, caKey, err := p.loadOrCreateCA("front-proxy-ca", "socialweb-tenant-front-proxy-ca")
	if err != nil {
		return fmt.Errorf("tenant front-proxy CA in %s: %w", p.Dir, err)
	}
	if c, _, err := loadPair(p.path("front-proxy-client")); err == nil && !stale(c, ca) && c.Subject.CommonName == FrontProxyClientName {
		return nil
	}
	c, k, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: FrontProxyClientName}, Usage: x509.ExtKeyUsageClientAuth, Validity: leafValidity})
	if err != nil {
		return err
	}
	return writePair(p.path("front-proxy-client"), c, k)
}

// loadOrCreateCA loads the CA pair base in the PKI dir, making one named cn when there is
// none: a CA is made once and kept, so what it signed stays valid across restarts.
func (p *PKI) loadOrCreateCA(base, cn string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	crt, key, err := loadPair(p.path(base))
	if errors.Is(err, os.ErrNotExist) {
		if crt, key, err = certs.NewCA(cn); err == nil {
			err = writePair(p.path(base), crt, key)
		}
	}
	return crt, key, err
}

func (p *PKI) path(base string) string { return filepath.Join(p.Dir, base) }

// Cert and Key are the file paths of a pair in the PKI dir.
func (p *PKI) Cert(base string) string { return p.path(base) + ".crt" }
func (p *PKI) Key(base string) string  { return p.path(base) + ".key" }

// IssueClient signs a client certificate for user/groups valid for ttl, returning PEM.
func (p *PKI) IssueClient(user string, groups []string, ttl time.Duration) (crtPEM, keyPEM []byte, notAfter time.Time, err error) {
	c, k, err := p.issue(pkix.Name{CommonName: user, Organization: groups}, x509.ExtKeyUsageClientAuth, nil, nil, ttl)
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	keyPEM, err = certs.KeyPEM(k)
	return certs.CertPEM(c.Raw), keyPEM, c.NotAfter, err
}

func (p *PKI) issue(subject pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string, ttl time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	return certs.Issue(p.CA, p.CAKey, certs.Leaf{Subject: subject, Usage: usage, IPs: ips, DNSNames: dns, Validity: ttl})
}

func stale(c *x509.Certificate, ca *x509.Certificate) bool {
	return time.Since(c.NotBefore) > leafRenewAfter || time.Until(c.NotAfter) < 24*time.Hour || c.CheckSignatureFrom(ca) != nil
}

// loadPair and writePair read and write the pair base.crt, base.key.
func loadPair(base string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	return certs.LoadPair(base+".crt", base+".key")
}

func writePair(base string, c *x509.Certificate, k *ecdsa.PrivateKey) error {
	return certs.WritePair(base+".crt", base+".key", c, k)
}
