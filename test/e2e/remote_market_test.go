package e2e

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/certs"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// Ports of the remote market row: up's PDS on remoteGate, the far bidder's secrets endpoint
// on remoteBidHost, the internet PDS's did:plc directory on remoteInetSide (its PDS on :80).
const (
	remotePDSPort     = "2583"
	remoteSecretsPort = "8443"
	remotePLCPort     = "2582"
)

// TestNode_RentedFromABidderOnAnotherHost: a pending pod of a tenant cluster gets a node
// rented through the market from a bidder on another host, everything between the two
// crossing a namespace that stands for the internet. There: a PDS holding the far bidder's
// account, whose did:plc directory every party resolves through (up registers its accounts
// with it, --plc-url). The far bidder (`socialweb bidder --substrate node`, on a host whose
// only link goes to the internet) follows up's PDS (--pds-listen on this host's public
// address) and serves its secrets endpoint over https (--tls-cert; up trusts the CA through
// SSL_CERT_FILE); up follows the internet PDS (--market-follow). up's own node bidder bids
// too, at a price; the far one bids free and wins. The join bundle reaches it through
// deliverSecrets, its node joins the cluster at --tenant-address, the pod runs there, and
// once it is deleted the contract is released and the far host keeps no node.
func TestNode_RentedFromABidderOnAnotherHost(t *testing.T) {
	t.Parallel()
	requireNodeHost(t)
	inet, bid := newRemoteHosts(t)

	rn := &relayNet{Netns: inet}
	far := rn.startRelayPDSWith(t, remoteInetSide, "", []string{"--account", "farbidder.test", "--plc-listen", remoteInetSide + ":" + remotePLCPort})
	if far.plc != "http://"+remoteInetSide+":"+remotePLCPort {
		t.Fatalf("the internet PDS's directory is at %q", far.plc)
	}

	caFile, certFile, keyFile := secretsEndpointCert(t, remoteBidHost)
	n := startNodeUpWith(t, func(c *exec.Cmd) { c.Env = append(os.Environ(), "SSL_CERT_FILE="+caFile) },
		"--tenant-address", remoteGate, "--pds-listen", remoteGate+":"+remotePDSPort, "--plc-url", far.plc,
		"--market-follow", far.url, "--node-cost", "1000")

	// The far bidder's host: its state, images and password; it runs in the bidder
	// namespace's network only (its nodes need the host's cgroups and /run).
	dir := t.TempDir()
	state, images, pwFile := filepath.Join(dir, "state"), filepath.Join(dir, "images"), filepath.Join(dir, "password")
	if err := os.WriteFile(pwFile, []byte(far.password), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := node.WriteBusyboxImage(filepath.Join(images, "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	endpoint := "https://" + remoteBidHost + ":" + remoteSecretsPort
	farBidder := startFarBidder(t, bid.Path(), state, "bidder", "--substrate", "node", "--node-flavour", node.FlavourNamespace,
		"--pds", far.url, "--identifier", far.handle, "--password-file", pwFile, "--plc-url", far.plc,
		"--follow", "http://"+remoteGate+":"+remotePDSPort, "--free", "--state-dir", state, "--image-dir", images,
		"--listen", remoteBidHost+":"+remoteSecretsPort, "--tls-cert", certFile, "--tls-key", keyFile,
		"--node-overlay-address", remoteBidHost, "--node-dns-upstream", "none", "--node-egress-deny", "0.0.0.0/0",
		// Pods reach nothing off the machine (the rows' policy), but a node's join server
		// must be an address its pods may reach: the control plane's public one.
		"--node-egress-allow", remoteGate+"/32")
	farGuests := &nodeUp{t: t, state: filepath.Join(state, "guests"), tags: map[string]string{}}

	// Its offering publishes the https endpoint.
	testenv.Eventually(t, 60*time.Second, "the far bidder's offering", func() (bool, error) {
		off, err := offeringOf(far.url, far.did)
		return err == nil && off.EndpointURL == endpoint, fmt.Errorf("%+v %v", off, err)
	})

	kc := n.cluster("rm", "maxNodes: 1, scaleHold: 3s")
	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("rm", 1, 3*time.Minute) {
		claim = c
	}
	waitPod(t, kc, "hello", "Succeeded", claim.Spec.NodeName, 3*time.Minute)
	cc, ccKey := n.contractOf(claim)
	if cc.Status.Winner != far.did {
		t.Errorf("the contract's winner is %q, want the far bidder %s (up's node bidder %s bids at a price)", cc.Status.Winner, far.did, n.bidder)
	}
	if g := farGuests.guests(); g != 1 {
		t.Errorf("the far bidder runs %d node guests, want 1", g)
	}
	if g := n.guests(); g != 0 {
		t.Errorf("up's node bidder runs %d node guests, want 0", g)
	}
	if out, err := tkubectlErr(kc, "logs", "hello"); err != nil || !strings.Contains(out, "hello from") {
		t.Errorf("logs of the pod on the far node (through its tunnel): %q %v", out, err)
	}

	tkubectl(t, kc, "", "delete", "pod", "hello")
	testenv.Eventually(t, 90*time.Second, "the claim gone", func() (bool, error) {
		cs := n.claims("rm")
		return len(cs) == 0, lazyErr(func() string { return fmt.Sprintf("%d claims\n%s", len(cs), n.dump()) })
	})
	testenv.Eventually(t, 60*time.Second, "the contract released", func() (bool, error) {
		err := n.c.Get(n.ctx, ccKey, &cc)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("%s %v", cc.Status.Phase, err)
	})
	farGuests.waitGuestsGone(60 * time.Second)
	farBidder.stop()
}

// secretsEndpointCert writes a CA and a serving certificate for ip it signs; it returns the
// files of the CA, the certificate and its key.
func secretsEndpointCert(t *testing.T, ip string) (caFile, certFile, keyFile string) {
	t.Helper()
	ca, caKey, err := certs.NewCA("remote market test CA")
	if err != nil {
		t.Fatal(err)
	}
	c, k, err := certs.Issue(ca, caKey, certs.Leaf{Subject: pkix.Name{CommonName: ip}, Usage: x509.ExtKeyUsageServerAuth,
		IPs: []net.IP{net.ParseIP(ip)}, Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := certs.KeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caFile, certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for f, b := range map[string][]byte{caFile: certs.CertPEM(ca.Raw), certFile: certs.CertPEM(c.Raw), keyFile: kp} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return caFile, certFile, keyFile
}

// startFarBidder runs the binary with args on the bidder host (netnsPath). At cleanup, once
// it is stopped, `node sweep --release` removes whatever nodes of stateDir are left, from
// the same namespace.
func startFarBidder(t *testing.T, netnsPath, stateDir string, args ...string) *hostProc {
	t.Helper()
	t.Cleanup(func() {
		if out, err := exec.Command("nsenter", "--net="+netnsPath, "--", socialwebBin, "node", "sweep", "--release", "--state-dir", stateDir).CombinedOutput(); err != nil {
			t.Errorf("sweeping the far bidder's nodes: %v %s", err, out)
		}
	})
	return startOnHost(t, netnsPath, "the far bidder", 60*time.Second, nil, append([]string{socialwebBin}, args...)...)
}

// offeringOf reads did's offering record from the PDS at pdsURL.
func offeringOf(pdsURL, did string) (mk.Offering, error) {
	var off mk.Offering
	resp, err := http.Get(pdsURL + "/xrpc/com.atproto.repo.getRecord?repo=" + did + "&collection=" + mk.OfferingNSID + "&rkey=self")
	if err != nil {
		return off, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return off, fmt.Errorf("%s: %s", resp.Status, b)
	}
	var rec struct {
		Value mk.Offering `json:"value"`
	}
	err = json.Unmarshal(b, &rec)
	return rec.Value, err
}
