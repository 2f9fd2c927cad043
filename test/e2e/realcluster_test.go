package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/ociimage"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// realClusterPDSIP is the PDS of the real-cluster row, in the namespace that stands for the
// internet: the controllers' pods reach it through their node's egress, as they would reach
// bsky.social.
const realClusterPDSIP = "203.0.113.20"

// TestRealCluster_ApplyKustomizeDeploysAnInfra runs the controllers as a user would on a
// cluster of their own: a tenant cluster of `up` (its own API server, a node with a kubelet,
// containerd and kube-proxy) stands for it. The image hack/image makes of the binary under
// test is loaded into the node, `kubectl apply -k config/default` installs the CRDs, RBAC and
// the Deployment, both replicas become Ready and one of them leads. An AtprotoRepo of an
// account on a PDS outside the cluster (with a core Secret holding its password) and an Infra
// applied there reach Deployed, won by a `socialweb bidder` outside the cluster. Deleting the
// leader's pod hands the Lease to the other replica within 5 s; the contract stays Deployed
// with the same accept and winner. Killing the new leader's process (kill -9) hands the Lease
// on within the lease duration, and that leader deploys a second Infra: the requester's repo
// holds two accepts and the bidder two guests, none duplicated.
func TestRealCluster_ApplyKustomizeDeploysAnInfra(t *testing.T) {
	requireNodeHost(t)
	requireTool(t, "kubectl")
	if _, err := deno.New(deno.Config{StateDir: t.TempDir()}); err != nil {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	ctx := context.Background()

	// The world outside the cluster: a PDS with the requester's and the bidder's accounts,
	// and the bidder, in the internet namespace.
	inet := substratetest.NewInternet(t)
	inet.IP(t, "addr", "add", realClusterPDSIP+"/32", "dev", "lo")
	dial := dialInNetns(inet.Path())
	rn := &relayNet{Netns: inet.Netns,
		HTTP: &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 30 * time.Second},
		WS:   &websocket.Dialer{NetDialContext: dial, HandshakeTimeout: 10 * time.Second}}
	p := rn.startRelayPDSWith(t, realClusterPDSIP, "", []string{"--account", "owner.test"})
	const bidderHandle, bidderPassword = "bidder.test", "pw-bidder.test"
	bidderDID := inviteAccount(t, ctx, rn, p, bidderHandle, bidderPassword).DID()
	bidderState := filepath.Join(t.TempDir(), "bidder")
	guests := filepath.Join(bidderState, "guests")
	if sub, err := deno.New(deno.Config{StateDir: guests}); err == nil {
		substratetest.Cleanup(t, sub, guests) // no guest outlives the row
	}
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte(bidderPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	bidderArgs := []string{socialwebBin, "bidder", "--pds", p.url, "--identifier", bidderHandle, "--password-file", pwFile,
		"--state-dir", bidderState, "--plc-url", p.plc, "--cost", "5", "--log-level", "info"}
	rn.start(t, bidderHandle, nil, false, append([]string{"sh", "-c", cgroupMountScript(t) + ` && exec "$@"`, "sh"}, bidderArgs...)...)

	// The cluster, with the image where its node imports images from.
	n := startNodeUp(t, "--node-bid-window", "1s")
	writeImage(t, filepath.Join(n.dir, "node-bidder", "images", "socialweb.tar"))
	kc := n.cluster("real", "maxNodes: 1, scaleHold: 5m")

	t0 := time.Now()
	tkubectl(t, kc, "", "apply", "-k", "../../config/default")
	const ns = "socialweb-system"
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, pod := range strings.Fields(tkubectl(t, kc, "", "-n", ns, "get", "pods", "-o", "jsonpath={.items[*].metadata.name}")) {
			logs, _ := tkubectlErr(kc, "-n", ns, "logs", pod, "--tail=40")
			t.Logf("pod %s log (tail):\n%s", pod, logs)
		}
	})
	tkubectl(t, kc, "", "-n", ns, "rollout", "status", "deployment/socialweb-controllers", "--timeout=300s")
	t.Logf("apply -k to both replicas Ready: %s", time.Since(t0).Round(time.Millisecond))
	pods := strings.Fields(tkubectl(t, kc, "", "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=controllers",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}"))
	if len(pods) != 2 {
		t.Fatalf("controllers pods running: %q, want 2", pods)
	}
	leader := func() string {
		out, _ := tkubectlErr(kc, "-n", ns, "get", "lease", manager.LeaderElectionID, "-o", "jsonpath={.spec.holderIdentity}")
		pod, _, _ := strings.Cut(strings.TrimSpace(out), "_") // controller-runtime: hostname_uuid
		return pod
	}
	var first string
	testenv.Eventually(t, 60*time.Second, "one replica holds the Lease", func() (bool, error) {
		first = leader()
		return first == pods[0] || first == pods[1], fmt.Errorf("holder %q, pods %q", first, pods)
	})

	// A repo of the user's own there: an account on the PDS, its password in a core Secret.
	infraYAML := `apiVersion: socialweb.computer/v1alpha1
kind: Infra
metadata: {name: web, namespace: default}
spec:
  record: {repoRef: {name: me}}
  contracts:
  - name: api
    computeKind: deno
    state: Requested
    policyArgs: {bidWindowSec: "3"}
    ports: [{name: http, port: 8080}]
    userData: |
      const port = Number(Deno.env.get("SOCIALWEB_PORT_HTTP"))
      Deno.serve({ hostname: "127.0.0.1", port }, () => new Response("hi"))
`
	tkubectl(t, kc, fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: owner-credentials, namespace: default}
stringData: {password: %q}
---
apiVersion: socialweb.computer/v1alpha1
kind: AtprotoRepo
metadata: {name: me, namespace: default}
spec:
  remote:
    service: %s
    identifier: %s
    credentialsRef: {name: owner-credentials}
---
`, p.password, p.url, p.handle)+infraYAML, "apply", "-f", "-")
	t0 = time.Now()
	tkubectl(t, kc, "", "wait", "--for=condition=Ready", "--timeout=120s", "atprotorepo/me")
	tkubectl(t, kc, "", "wait", "--for=jsonpath={.status.phase}=Deployed", "--timeout=180s", "infra/web")
	t.Logf("repo Ready and Infra Deployed in %s", time.Since(t0).Round(time.Millisecond))
	contract := func() (winner, accept string) {
		out := tkubectl(t, kc, "", "get", "computecontract", "infra-web-api", "-o", "jsonpath={.status.winner} {.status.accept}")
		winner, accept, _ = strings.Cut(out, " ")
		return winner, accept
	}
	winner, accept := contract()
	if winner != bidderDID || !strings.HasPrefix(accept, "at://"+p.did+"/") {
		t.Fatalf("winner %q accept %q: want the bidder %s outside the cluster, the accept in %s", winner, accept, bidderDID, p.did)
	}

	// The leader's pod goes (a graceful delete): the other replica leads within 5 s.
	t0 = time.Now()
	tkubectl(t, kc, "", "-n", ns, "delete", "pod", first, "--wait=false")
	var second string
	testenv.Eventually(t, 30*time.Second, "the other replica takes the Lease", func() (bool, error) {
		second = leader()
		return second != "" && second != first, fmt.Errorf("holder %q", second)
	})
	took := time.Since(t0)
	t.Logf("handover after the leader's pod was deleted: %s (%s -> %s)", took.Round(time.Millisecond), first, second)
	if took > 5*time.Second {
		t.Errorf("handover took %s, want within 5 s", took)
	}
	// The new leader reconciles everything once; nothing is requested again.
	time.Sleep(10 * time.Second)
	if w, a := contract(); w != winner || a != accept {
		t.Errorf("after the handover: winner %q accept %q, want %q %q", w, a, winner, accept)
	}
	if phase := tkubectl(t, kc, "", "get", "infra", "web", "-o", "jsonpath={.status.phase}"); phase != "Deployed" {
		t.Errorf("Infra phase %q after the handover, want Deployed", phase)
	}

	// The leader's process is killed outright (its container restarts in the same pod):
	// another process takes the Lease once it expires.
	identity := func() string {
		out, _ := tkubectlErr(kc, "-n", ns, "get", "lease", manager.LeaderElectionID, "-o", "jsonpath={.spec.holderIdentity}")
		return strings.TrimSpace(out)
	}
	held := identity()
	pid := podProcess(t, second, "/socialweb", "controllers")
	t0 = time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (the leader %s): %v", pid, second, err)
	}
	var third string
	testenv.Eventually(t, 60*time.Second, "another process takes the Lease of the killed leader", func() (bool, error) {
		third = identity()
		return third != "" && third != held, fmt.Errorf("holder %q", third)
	})
	took = time.Since(t0)
	t.Logf("takeover after kill -9 of the leader's process: %s (%s -> %s)", took.Round(time.Millisecond), held, third)
	if bound := manager.LeaseDuration + 5*time.Second; took > bound {
		t.Errorf("takeover after kill -9 took %s, want within %s (lease duration and two retries)", took, bound)
	}

	// The third leader runs the market: a second Infra is Deployed, the first untouched.
	tkubectl(t, kc, strings.Replace(infraYAML, "name: web,", "name: web2,", 1), "apply", "-f", "-")
	tkubectl(t, kc, "", "wait", "--for=jsonpath={.status.phase}=Deployed", "--timeout=180s", "infra/web2")
	if w, a := contract(); w != winner || a != accept {
		t.Errorf("after the kill: winner %q accept %q, want %q %q", w, a, winner, accept)
	}
	if got := countRecords(t, rn.HTTP, p.url, p.did, market.AcceptNSID); got != 2 {
		t.Errorf("%d accepts in the requester's repo for two Infras, want 2", got)
	}
	if entries, err := os.ReadDir(guests); err != nil || len(entries) != 2 {
		t.Errorf("the bidder's guests: %v %v, want two", entries, err)
	}
	// The generated RBAC held for everything the run did: no replica was refused anything.
	for _, pod := range strings.Fields(tkubectl(t, kc, "", "-n", ns, "get", "pods", "-o", "jsonpath={.items[*].metadata.name}")) {
		logs, err := tkubectlErr(kc, "-n", ns, "logs", pod)
		if err != nil || strings.Contains(strings.ToLower(logs), "forbidden") {
			t.Errorf("pod %s: %v; its log:\n%s", pod, err, logs)
		}
	}
}

// podProcess is the pid, as this host sees it, of the process of pod (its HOSTNAME, as the
// kubelet sets it) whose argv begins with argv.
func podProcess(t *testing.T, pod string, argv ...string) int {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err1 := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		environ, err2 := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err1 != nil || err2 != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if len(args) < len(argv) || !slices.Equal(args[:len(argv)], argv) {
			continue
		}
		if slices.Contains(strings.Split(string(environ), "\x00"), "HOSTNAME="+pod) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("processes %q of pod %s: %v, want one", argv, pod, found)
	}
	return found[0]
}

// writeImage writes the image of the binary under test (hack/image: the binary, the CA
// bundle, user 65532) to path.
func writeImage(t *testing.T, path string) {
	t.Helper()
	ca := "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(ca); err != nil {
		t.Skipf("no CA bundle: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	img := exec.Command("go", "run", "./hack/image", "--binary", socialwebBin, "--ca", ca, "--version", "v0.0.0-e2e", "--out", path)
	img.Dir = "../.."
	if out, err := img.CombinedOutput(); err != nil {
		t.Fatalf("hack/image of %s (hack/build.sh builds it static): %v\n%s", socialwebBin, err, out)
	}
	t.Logf("image %s of %s in %s", ociimage.Name, socialwebBin, time.Since(t0).Round(time.Millisecond))
}

// countRecords is how many records of collection the repo did on the PDS at base holds.
func countRecords(t *testing.T, c *http.Client, base, did, collection string) int {
	t.Helper()
	var out struct {
		Records []struct {
			URI string `json:"uri"`
		} `json:"records"`
	}
	rn := &relayNet{HTTP: c}
	rn.getJSON(t, base+"/xrpc/com.atproto.repo.listRecords?limit=100&repo="+url.QueryEscape(did)+"&collection="+url.QueryEscape(collection), &out)
	return len(out.Records)
}
