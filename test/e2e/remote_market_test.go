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
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// Overlay ports of up's node bidder in the remote market row (TestNode_JoinsFromAnotherHost's
// near node takes 51910-51919; the rows hold the remote hosts one at a time, but a node's
// forward outlives its row by its release).
const remoteMarketOverlayPorts = "51920-51929"

// TestNode_RentedFromABidderOnAnotherHost: the nodes of one tenant cluster are rented
// through the market from two bidders on two hosts, everything between the hosts crossing
// a namespace that stands for the internet. There: a PDS holding the far bidder's account,
// whose did:plc directory every party resolves through (up registers its accounts with it,
// --plc-url). The far bidder (`socialweb bidder --substrate node --capacity 1`, on a host
// whose only link goes to the internet) follows up's PDS (--pds-listen on this host's public
// address) and serves its secrets endpoint over https (--tls-cert; up trusts the CA through
// SSL_CERT_FILE); up follows the internet PDS (--market-follow). up's own node bidder bids
// too, at a price. The first pending pod's node goes to the far bidder (free); the second
// pod, kept off the first one's node, gets a node from up's bidder (the far one is full).
// Both nodes publish overlay endpoints on their hosts' public addresses: each pod reaches
// the other by pod IP and through its Service's name, and the apiserver reaches both pods
// through their nodes' tunnels (exec). Once the pods are deleted both contracts are
// released and neither host keeps a node.
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
		"--market-follow", far.url, "--node-cost", "1000",
		// up's nodes are overlay peers of nodes on other hosts, and their pods may reach the
		// bidder host's link, where the far node's overlay endpoint is.
		"--node-overlay-address", remoteGate, "--node-overlay-ports", remoteMarketOverlayPorts,
		"--node-egress-allow", remoteBidNet)
	writeProbeImage(t, filepath.Join(n.dir, "node-bidder", "images"))

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
	writeProbeImage(t, images)
	endpoint := "https://" + remoteBidHost + ":" + remoteSecretsPort
	farBidder := startFarBidder(t, bid.Path(), state, "bidder", "--substrate", "node", "--node-flavour", node.FlavourNamespace,
		"--pds", far.url, "--identifier", far.handle, "--password-file", pwFile, "--plc-url", far.plc,
		"--follow", "http://"+remoteGate+":"+remotePDSPort, "--free", "--capacity", "1", "--state-dir", state, "--image-dir", images,
		"--listen", remoteBidHost+":"+remoteSecretsPort, "--tls-cert", certFile, "--tls-key", keyFile,
		"--node-overlay-address", remoteBidHost, "--node-dns-upstream", "none", "--node-egress-deny", "0.0.0.0/0",
		// Pods reach nothing off the machine (the rows' policy), but a node's join server
		// must be an address its pods may reach: the control plane's public one, where up's
		// nodes publish their overlay endpoints too.
		"--node-egress-allow", remoteGate+"/32")
	farGuests := &nodeUp{t: t, state: filepath.Join(state, "guests"), tags: map[string]string{}}

	// Its offering publishes the https endpoint.
	testenv.Eventually(t, 60*time.Second, "the far bidder's offering", func() (bool, error) {
		off, err := offeringOf(far.url, far.did)
		return err == nil && off.EndpointURL == endpoint, fmt.Errorf("%+v %v", off, err)
	})

	kc := n.cluster("rm", "maxNodes: 2, scaleHold: 3s")
	// winnerOf is the winner of the contract of the claim whose node runs pod.
	winnerOf := func(claims map[string]v1alpha1.NodeClaim, pod, nodeName string) (string, client.ObjectKey) {
		c, ok := claims[nodeName]
		if !ok {
			t.Fatalf("pod %s runs on %s, which no claim of the cluster names (%d claims)", pod, nodeName, len(claims))
		}
		cc, key := n.contractOf(c)
		return cc.Status.Winner, key
	}

	// The first pod: the far bidder's free bid wins its node.
	tkubectl(t, kc, meshPod("a", ""), "apply", "-f", "-")
	claims := n.waitClaimsRunning("rm", 1, 3*time.Minute)
	nodeA := waitPod(t, kc, "a", "Running", "", 3*time.Minute)
	winnerA, keyA := winnerOf(claims, "a", nodeA)
	if winnerA != far.did {
		t.Errorf("the first node's winner is %q, want the far bidder %s (up's node bidder %s bids at a price)", winnerA, far.did, n.bidder)
	}
	// The second: the far bidder is full (--capacity 1), up's bidder wins at its price.
	tkubectl(t, kc, meshPod("b", "a"), "apply", "-f", "-")
	claims = n.waitClaimsRunning("rm", 2, 3*time.Minute)
	nodeB := waitPod(t, kc, "b", "Running", "", 3*time.Minute)
	winnerB, keyB := winnerOf(claims, "b", nodeB)
	if winnerB != n.bidder {
		t.Errorf("the second node's winner is %q, want up's node bidder %s (the far bidder %s is full)", winnerB, n.bidder, far.did)
	}
	if g := farGuests.guests(); g != 1 {
		t.Errorf("the far bidder runs %d node guests, want 1", g)
	}
	if g := n.guests(); g != 1 {
		t.Errorf("up's node bidder runs %d node guests, want 1", g)
	}

	// Each pod reaches the other across the two hosts' overlay, by pod IP and by Service
	// name; the exec itself crosses each node's tunnel.
	for _, p := range [][2]string{{"a", "b"}, {"b", "a"}} {
		from, to := p[0], p[1]
		for _, url := range []string{"http://" + podIP(t, kc, to) + ":8080/", "http://" + to + ".default.svc.cluster.local/"} {
			testenv.Eventually(t, 60*time.Second, "pod "+from+" reaches "+url, func() (bool, error) {
				out, err := tkubectlErr(kc, "exec", from, "--", "/svcprobe", "get", url)
				out = strings.TrimSpace(out)
				return err == nil && out == "200 "+to, fmt.Errorf("%q %v\n%s", out, err, n.dump())
			})
		}
	}

	tkubectl(t, kc, "", "delete", "pod", "a", "b")
	testenv.Eventually(t, 90*time.Second, "the claims gone", func() (bool, error) {
		cs := n.claims("rm")
		return len(cs) == 0, lazyErr(func() string { return fmt.Sprintf("%d claims\n%s", len(cs), n.dump()) })
	})
	for _, key := range []client.ObjectKey{keyA, keyB} {
		testenv.Eventually(t, 60*time.Second, "contract "+key.Name+" released", func() (bool, error) {
			var cc v1alpha1.ComputeContract
			err := n.c.Get(n.ctx, key, &cc)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return err == nil && cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("%s %v", cc.Status.Phase, err)
		})
	}
	farGuests.waitGuestsGone(60 * time.Second)
	n.waitGuestsGone(60 * time.Second)
	farBidder.stop()
}

// meshPod is pod name (label app: name) serving its name on port 8080 (probeServerOf), ready
// once it answers, and its Service name (port 80); with notWith, the pod is kept off the node
// of pod notWith.
func meshPod(name, notWith string) string {
	pod := probeServerOf(name, name) + `    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
`
	if notWith != "" {
		pod += `  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - {labelSelector: {matchLabels: {app: ` + notWith + `}}, topologyKey: kubernetes.io/hostname}
`
	}
	return pod + `---
apiVersion: v1
kind: Service
metadata: {name: ` + name + `, namespace: default}
spec:
  selector: {app: ` + name + `}
  ports: [{port: 80, targetPort: http}]
`
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
