package tenant

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Kubeconfig TTLs for MintKubeconfig.
const (
	DefaultKubeconfigTTL = 8 * time.Hour
	MinKubeconfigTTL     = 60 * time.Second
	MaxKubeconfigTTL     = 24 * time.Hour
)

// ErrTTLOutOfRange is wrapped by a TTLError: errors.Is(err, ErrTTLOutOfRange).
var ErrTTLOutOfRange = errors.New("kubeconfig TTL out of range")

// TTLError refuses a TTL outside [MinKubeconfigTTL, MaxKubeconfigTTL].
type TTLError struct{ TTL time.Duration }

func (e *TTLError) Error() string {
	return fmt.Sprintf("kubeconfig TTL %s is outside %s..%s", e.TTL, MinKubeconfigTTL, MaxKubeconfigTTL)
}

func (e *TTLError) Unwrap() error { return ErrTTLOutOfRange }

// CheckTTL returns the TTL to use: 0 means the default; outside the range is a *TTLError.
func CheckTTL(ttl time.Duration) (time.Duration, error) {
	if ttl == 0 {
		return DefaultKubeconfigTTL, nil
	}
	if ttl < MinKubeconfigTTL || ttl > MaxKubeconfigTTL {
		return 0, &TTLError{TTL: ttl}
	}
	return ttl, nil
}

// kubeconfig is a client-certificate kubeconfig (no token, no exec plugin) for server.
func kubeconfig(name, server string, caPEM, crtPEM, keyPEM []byte) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificateData: crtPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}

// kubeconfigFiles is a kubeconfig pointing at certificate files (for the components).
func kubeconfigFiles(name, server, caFile, crtFile, keyFile string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificate: crtFile, ClientKey: keyFile}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	cfg.CurrentContext = name
	return clientcmd.Write(*cfg)
}
