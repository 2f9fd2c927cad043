package tenant

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

func TestMintNodeBundle(t *testing.T) {
	root := t.TempDir()
	k := Key{Namespace: "acct-x", Name: "web"}
	if _, err := MintNodeBundle(root, k, "n1", "https://10.77.0.1:1", 0); !errors.Is(err, ErrNoCA) {
		t.Fatalf("before the CA exists: %v, want ErrNoCA", err)
	}
	p, err := EnsurePKI(LayoutFor(root, k.Namespace, k.Name).PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := MintNodeBundle(root, k, "n1", "https://10.77.0.1:1", 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(b.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if cfg.Clusters[ctx.Cluster].Server != "https://10.77.0.1:1" {
		t.Errorf("server %q", cfg.Clusters[ctx.Cluster].Server)
	}
	blk, _ := pem.Decode(cfg.AuthInfos[ctx.AuthInfo].ClientCertificateData)
	crt, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if crt.Subject.CommonName != "system:node:n1" || !slices.Equal(crt.Subject.Organization, []string{"system:nodes"}) || crt.CheckSignatureFrom(p.CA) != nil {
		t.Errorf("certificate %q %v not a node identity signed by the cluster CA", crt.Subject.CommonName, crt.Subject.Organization)
	}
	if d := time.Until(b.NotAfter); d < NodeBundleTTL-time.Hour || d > NodeBundleTTL+time.Hour {
		t.Errorf("valid for %s", d)
	}
	data := b.Data()
	for _, key := range []string{BundleKeyServer, BundleKeyCA, BundleKeyKubeconfig, BundleKeyNotAfter} {
		if len(data[key]) == 0 {
			t.Errorf("bundle data lacks %s", key)
		}
	}
}
