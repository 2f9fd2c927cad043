package tenant

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"socialweb.computer/internal/hostcheck"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"socialweb.computer/internal/certs"
)

func TestCheckTTL(t *testing.T) {
	for _, c := range []struct {
		in, want time.Duration
		bad      bool
	}{
		{0, DefaultKubeconfigTTL, false},
		{60 * time.Second, 60 * time.Second, false},
		{24 * time.Hour, 24 * time.Hour, false},
		{59 * time.Second, 0, true},
		{24*time.Hour + time.Second, 0, true},
		{-time.Hour, 0, true},
	} {
		got, err := CheckTTL(c.in)
		if c.bad {
			var te *TTLError
			if !errors.As(err, &te) || !errors.Is(err, ErrTTLOutOfRange) {
				t.Errorf("CheckTTL(%s) = %v, want a *TTLError wrapping ErrTTLOutOfRange", c.in, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("CheckTTL(%s) = %s, %v; want %s", c.in, got, err, c.want)
		}
	}
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPKIAndMintedKubeconfig(t *testing.T) {
	root := t.TempDir()
	k := Key{Namespace: "ws", Name: "c1"}
	l := LayoutFor(root, k.Namespace, k.Name)
	ips := []net.IP{net.IPv4(127, 0, 0, 1), AdvertiseIP, firstServiceIP()}
	p, err := EnsurePKI(l.PKI(), ips, ServingDNSNames)
	if err != nil {
		t.Fatal(err)
	}
	srv := readCert(t, p.Cert("apiserver"))
	if !certs.CoversIPs(srv, ips) || srv.CheckSignatureFrom(p.CA) != nil {
		t.Errorf("serving certificate SANs %v, want %v signed by the cluster CA", srv.IPAddresses, ips)
	}
	if firstServiceIP().String() != "10.43.0.1" {
		t.Errorf("first service IP %s", firstServiceIP())
	}
	for _, id := range ComponentIdentities {
		c := readCert(t, p.Cert(id.File))
		if c.Subject.CommonName != id.User || !slices.Equal(c.Subject.Organization, id.Groups) || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
			t.Errorf("%s: CN %q usage %v", id.File, c.Subject.CommonName, c.ExtKeyUsage)
		}
	}
	// The aggregation layer's client is signed by a CA of its own: nothing the cluster CA
	// signs (an owner's or a node's certificate) can assert a user to an aggregated API.
	fpCA, fp := readCert(t, p.Cert("front-proxy-ca")), readCert(t, p.Cert("front-proxy-client"))
	if fp.Subject.CommonName != FrontProxyClientName || fp.CheckSignatureFrom(fpCA) != nil || fp.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("front-proxy client: CN %q, want %q signed by the front-proxy CA for client auth", fp.Subject.CommonName, FrontProxyClientName)
	}
	if fpCA.Equal(p.CA) || fp.CheckSignatureFrom(p.CA) == nil {
		t.Error("the front-proxy client is signed by the cluster CA")
	}
	for _, f := range []string{"sa.key", "sa.pub"} {
		if _, err := os.Stat(filepath.Join(l.PKI(), f)); err != nil {
			t.Error(err)
		}
	}
	// A second EnsurePKI keeps the CA (kubeconfigs stay valid across restarts).
	p2, err := EnsurePKI(l.PKI(), ips, ServingDNSNames)
	if err != nil || !p2.CA.Equal(p.CA) {
		t.Fatalf("CA changed on reload: %v", err)
	}
	if !readCert(t, p.Cert("front-proxy-client")).Equal(fp) {
		t.Error("front-proxy client reissued on reload")
	}

	b, notAfter, err := MintKubeconfig(root, k, "did:plc:owner", "https://127.0.0.1:1234", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(notAfter); d < 59*time.Minute || d > time.Hour {
		t.Errorf("minted certificate valid for %s, want 1h", d)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	ai := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	if ai.Token != "" || ai.Exec != nil || len(ai.ClientCertificateData) == 0 {
		t.Errorf("want a client-certificate kubeconfig without token or exec: %+v", ai)
	}
	blk, _ := pem.Decode(ai.ClientCertificateData)
	c, _ := x509.ParseCertificate(blk.Bytes)
	if c.Subject.CommonName != "did:plc:owner" || c.CheckSignatureFrom(p.CA) != nil {
		t.Errorf("minted certificate CN %q, signed by the cluster CA: %v", c.Subject.CommonName, c.CheckSignatureFrom(p.CA))
	}
	if _, _, err := MintKubeconfig(root, k, "did:plc:owner", "https://x", 25*time.Hour); !errors.Is(err, ErrTTLOutOfRange) {
		t.Errorf("25h TTL: %v, want ErrTTLOutOfRange", err)
	}
	if _, _, err := MintKubeconfig(root, Key{"ws", "absent"}, "did:plc:owner", "https://x", 0); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("minting for a cluster without a CA: %v, want fs.ErrNotExist", err)
	}
	// noExpiry: as long as the CA, and never past it.
	_, notAfter, err = MintKubeconfigNoExpiry(root, k, "did:plc:owner", "https://127.0.0.1:1234")
	if err != nil {
		t.Fatal(err)
	}
	if notAfter.After(p.CA.NotAfter) || p.CA.NotAfter.Sub(notAfter) > 2*time.Minute {
		t.Errorf("no-expiry certificate ends %s, CA %s", notAfter, p.CA.NotAfter)
	}
}

func TestBuildSpecFlags(t *testing.T) {
	root := t.TempDir()
	l := LayoutFor(root, "ws", "c1")
	p, err := EnsurePKI(l.PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := BuildSpec(l, p, 4321, AdvertiseIP, Revocations{}, "kid", time.Now())
	api := strings.Join(s.APIServer, " ")
	for _, want := range []string{
		"--secure-port=4321", "--bind-address=127.0.0.1", "--advertise-address=10.77.0.1",
		"--kubelet-preferred-address-types=InternalIP", "--anonymous-auth=false",
		"--etcd-servers=unix://" + l.EtcdSocket(),
		"--enable-priority-and-fairness=false",
		"--allow-privileged=false",
		"--enable-admission-plugins=NodeRestriction,PodSecurity," + FloorPluginName,
		"--admission-control-config-file=" + l.AdmissionConfig(),
		"--egress-selector-config-file=" + l.EgressSelectorConfig(),
	} {
		if !strings.Contains(api, want) {
			t.Errorf("apiserver flags lack %s", want)
		}
	}
	// The flowcontrol API is served (clients and the conformance suite use it); only the
	// request classification is off.
	if strings.Contains(api, "flowcontrol") {
		t.Errorf("apiserver flags turn the flowcontrol API off: %s", api)
	}
	for name, args := range map[string][]string{"controller-manager": s.ControllerManager, "scheduler": s.Scheduler} {
		j := strings.Join(args, " ")
		if !strings.Contains(j, "--secure-port=0") || !strings.Contains(j, "--leader-elect=false") {
			t.Errorf("%s flags: %s", name, j)
		}
	}
	cm := strings.Join(s.ControllerManager, " ")
	// What tenants' workloads and the conformance suite expect runs; what a cluster of
	// on-demand nodes does not need stays off.
	for _, c := range []string{"resourcequota-controller", "horizontal-pod-autoscaler-controller", "endpointslice-mirroring-controller", "ephemeral-volume-controller", "node-ipam-controller", "volumeattributesclass-protection-controller"} {
		if strings.Contains(cm, "-"+c) {
			t.Errorf("controller-manager disables %s", c)
		}
	}
	if !strings.Contains(cm, "-ttl-controller") {
		t.Error("controller-manager runs the TTL controller")
	}
	if !strings.Contains(cm, "--cluster-signing-duration=24h0m0s") || strings.Contains(cm, "-csrsigning") || strings.Contains(cm, "-csrapproving") {
		t.Errorf("controller-manager does not sign and approve day-long node certificates: %s", cm)
	}
	// Every Node gets its own /24 of the pod network: a cluster whose nodes all used one
	// subnet gave two pods on two nodes the same address.
	for _, want := range []string{"--allocate-node-cidrs=true", "--cluster-cidr=10.42.0.0/16", "--node-cidr-mask-size=24"} {
		if !strings.Contains(cm, want) {
			t.Errorf("controller-manager flags lack %s", want)
		}
	}
	if strings.Contains(cm, "-node-ipam-controller") {
		t.Error("controller-manager has node IPAM turned off")
	}
	if s.ReadyzURL != "https://127.0.0.1:4321/readyz" {
		t.Errorf("readyz %s", s.ReadyzURL)
	}
	if s.APIServerStartGCPercent != 400 || s.IdleGCPercent != 25 {
		t.Errorf("GC percent at the apiserver's start %d, idle %d", s.APIServerStartGCPercent, s.IdleGCPercent)
	}
}

func TestLeasedPortsAreKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ports.json")
	a, err := leasePorts(path)
	if err != nil || a.APIServer == 0 || a.Gate == 0 || a.APIServer == a.Gate {
		t.Fatalf("leased %+v, %v", a, err)
	}
	b, err := leasePorts(path)
	if err != nil || a != b {
		t.Fatalf("second lease %+v, want %+v (%v)", b, a, err)
	}
	// A port taken by someone else is leased anew.
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", a.Gate))
	if err != nil {
		t.Skip("port reused meanwhile")
	}
	defer ln.Close()
	c, err := leasePorts(path)
	if err != nil || c.Gate == a.Gate || c.APIServer != a.APIServer {
		t.Fatalf("with the gate port taken: %+v", c)
	}
}

func TestOwnerServiceAccountName(t *testing.T) {
	a, b := OwnerServiceAccount("did:plc:aaa"), OwnerServiceAccount("did:plc:bbb")
	if a == b || !strings.HasPrefix(a, "account-") || len(a) != len("account-")+16 {
		t.Errorf("names %q %q", a, b)
	}
}

func TestAdvertiseAddressChecks(t *testing.T) {
	for _, bad := range []string{"127.0.0.1", "0.0.0.0", "nope", "192.0.2.123"} {
		if _, err := CheckAdvertiseAddress(bad); err == nil {
			t.Errorf("CheckAdvertiseAddress(%q) accepted", bad)
		}
	}
	if _, err := NewManager(Config{Root: t.TempDir(), Binary: "x", Advertise: net.IPv4(127, 0, 0, 1)}); err == nil {
		t.Error("a loopback advertise address was accepted")
	}
}

// The host check names the tenants' advertise address without importing this package.
func TestHostCheckAgreesOnTheAdvertiseAddress(t *testing.T) {
	if hostcheck.TenantAdvertiseIP != AdvertiseIP.String() {
		t.Errorf("the host check says %s, tenants advertise %s", hostcheck.TenantAdvertiseIP, AdvertiseIP)
	}
}
