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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"

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
const realClusterPDSIP = "198.51.100.70"

// TestRealCluster_ApplyKustomizeDeploysAnInfra runs the controllers as a user would on a
// cluster of their own: a tenant cluster of `up` (its own API server, a node with a kubelet,
// containerd and kube-proxy) stands for it. The image hack/image makes of the binary under
// test is loaded into the node, `kubectl apply -k config/default` installs the CRDs, RBAC and
// the Deployment, both replicas become Ready and one of them leads. An AtprotoRepo of an
// account on a PDS outside the cluster (with a core Secret holding its password) and an Infra
// applied there reach Deployed, won by a `socialweb bidder` outside the cluster. Deleting the
// leader's pod hands the Lease to the other replica within 5 s; the contract stays Deployed
// with the same accept and winner. Killing the new leader's process (kill -9) hands the Lease
// to the other replica within the lease duration (the killed container's next run releases
// it), and that leader deploys a second Infra: the requester's repo
// holds two accepts and the bidder two guests, none duplicated.
func TestRealCluster_ApplyKustomizeDeploysAnInfra(t *testing.T) {
	t.Parallel()
	rc := startRealCluster(t, 1)
	kc, p, rn, ns := rc.kc, rc.pds, rc.rn, realClusterNamespace
	bidderDID, guests := rc.bidders[0].did, rc.bidders[0].guests
	pods := strings.Fields(tkubectl(t, kc, "", "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=controllers",
		"--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}"))
	if len(pods) != 2 {
		t.Fatalf("controllers pods running: %q, want 2", pods)
	}
	// identity is the Lease's holder; leader its pod (identity POD_NAME_POD_UID).
	identity := func() string {
		out, _ := tkubectlErr(kc, "-n", ns, "get", "lease", manager.LeaderElectionID, "-o", "jsonpath={.spec.holderIdentity}")
		return strings.TrimSpace(out)
	}
	leader := func() string {
		pod, _, _ := strings.Cut(identity(), "_")
		return pod
	}
	// acquired is when the Lease's holder took it, by the new leader's clock (this host's):
	// a handover is timed to it rather than to when a kubectl poll of this test saw it, which
	// on a loaded host lags by a second or more.
	acquired := func() time.Time {
		out := tkubectl(t, kc, "", "-n", ns, "get", "lease", manager.LeaderElectionID, "-o", "jsonpath={.spec.acquireTime}")
		at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("the Lease's acquireTime %q: %v", out, err)
		}
		return at
	}
	var first string
	testenv.Eventually(t, 60*time.Second, "one replica holds the Lease", func() (bool, error) {
		first = leader()
		return first == pods[0] || first == pods[1], fmt.Errorf("holder %q, pods %q", first, pods)
	})

	// A repo of the user's own there: an account on the PDS, its password in a core Secret.
	t0 := time.Now()
	rc.repo(t)
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
	tkubectl(t, kc, infraYAML, "apply", "-f", "-")
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
	took := acquired().Sub(t0)
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

	// The leader's process is killed outright: its container restarts in the same pod, and
	// that run releases the Lease the killed one held (same pod, same identity), so the
	// other replica leads within the lease duration, as it would by the Lease's expiry only
	// about a second past it.
	// The takeover by expiry needs a replica waiting for the Lease: the one replacing the
	// deleted pod must be Ready (its manager started, so its elector retrying) first.
	tkubectl(t, kc, "", "-n", ns, "rollout", "status", "deployment/socialweb-controllers", "--timeout=300s")
	held := identity()
	pid := podProcess(t, second, "/socialweb", "controllers")
	t0 = time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (the leader %s): %v", pid, second, err)
	}
	var third string
	testenv.Eventually(t, 60*time.Second, "the other replica takes the Lease of the killed leader", func() (bool, error) {
		third = leader()
		return third != "" && third != second, fmt.Errorf("holder %q", identity())
	})
	took = acquired().Sub(t0)
	t.Logf("takeover after kill -9 of the leader's process: %s (%s -> %s)", took.Round(time.Millisecond), held, identity())
	if took > manager.LeaseDuration {
		t.Errorf("takeover after kill -9 took %s, want within the lease duration (%s)", took, manager.LeaseDuration)
	}

	// The third leader runs the market: a second Infra is Deployed, the first untouched.
	tkubectl(t, kc, strings.Replace(infraYAML, "name: web,", "name: web2,", 1), "apply", "-f", "-")
	tkubectl(t, kc, "", "wait", "--for=jsonpath={.status.phase}=Deployed", "--timeout=180s", "infra/web2")
	if w, a := contract(); w != winner || a != accept {
		t.Errorf("after the kill: winner %q accept %q, want %q %q", w, a, winner, accept)
	}
	if got := countRecords(t, rn, p.url, p.did, market.AcceptNSID); got != 2 {
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

// realClusterNamespace is config/default's namespace.
const realClusterNamespace = "socialweb-system"

// realCluster is a user's cluster with the controllers deployed by `kubectl apply -k
// config/default` from the image of the binary under test (a tenant cluster of `up`, with one
// node), and outside it, in the namespace that stands for the internet, a PDS holding the
// requester's account (owner.test) and bidders' accounts, and `socialweb bidder` processes.
type realCluster struct {
	kc      string // the tenant's admin kubeconfig
	pds     *relayPDS
	rn      *relayNet
	bidders []*realBidder
}

type realBidder struct {
	handle, did, guests string
	proc                *nsProc
}

// startRealCluster stands the cluster and the world outside it up with n bidders (each with
// its own state dir, and bidderFlags) and waits until both replicas are Ready.
func startRealCluster(t *testing.T, n int, bidderFlags ...string) *realCluster {
	t.Helper()
	requireNodeHost(t)
	requireTool(t, "kubectl")
	if _, err := deno.New(deno.Config{StateDir: t.TempDir()}); err != nil {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	ctx := context.Background()

	inet := substratetest.NewInternet(t)
	inet.IP(t, "addr", "add", realClusterPDSIP+"/32", "dev", "lo")
	dial := dialInNetns(inet.Path())
	rc := &realCluster{rn: &relayNet{Netns: inet.Netns,
		HTTP: &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 30 * time.Second},
		WS:   &websocket.Dialer{NetDialContext: dial, HandshakeTimeout: 10 * time.Second}}}
	rc.pds = rc.rn.startRelayPDSWith(t, realClusterPDSIP, "", []string{"--account", "owner.test"})
	for i := range n {
		handle := "bidder.test"
		if n > 1 {
			handle = fmt.Sprintf("bidder%d.test", i+1)
		}
		password := "pw-" + handle
		b := &realBidder{handle: handle, did: inviteAccount(t, ctx, rc.rn, rc.pds, handle, password).DID()}
		state := filepath.Join(t.TempDir(), "bidder")
		b.guests = filepath.Join(state, "guests")
		if sub, err := deno.New(deno.Config{StateDir: b.guests}); err == nil {
			substratetest.Cleanup(t, sub, b.guests) // no guest outlives the row
		}
		b.proc = rc.rn.startBidder(t, rc.pds.url, handle, password, state, rc.pds.plc, bidderFlags...)
		rc.bidders = append(rc.bidders, b)
	}

	// The cluster, with the image where its node imports images from.
	nu := startNodeUp(t, "--node-bid-window", "1s")
	writeImage(t, filepath.Join(nu.dir, "node-bidder", "images", "socialweb.tar"))
	nu.cluster("real", "maxNodes: 1, scaleHold: 5m")
	rc.kc = mintFor(t, nu.dir, "default", "real", "2h") // the benchmark outlasts mint's 10 min
	kc, ns := rc.kc, realClusterNamespace

	t0 := time.Now()
	tkubectl(t, kc, "", "apply", "-k", "../../config/default")
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
	return rc
}

// repo applies the owner's AtprotoRepo `me` (a remote repo on the PDS, its password in a
// core Secret) and waits until it is Ready.
func (rc *realCluster) repo(t *testing.T) {
	t.Helper()
	tkubectl(t, rc.kc, fmt.Sprintf(`apiVersion: v1
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
`, rc.pds.password, rc.pds.url, rc.pds.handle), "apply", "-f", "-")
	tkubectl(t, rc.kc, "", "wait", "--for=condition=Ready", "--timeout=120s", "atprotorepo/me")
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
func countRecords(t *testing.T, rn *relayNet, base, did, collection string) int {
	t.Helper()
	var out struct {
		Records []struct {
			URI string `json:"uri"`
		} `json:"records"`
	}
	rn.getJSON(t, base+"/xrpc/com.atproto.repo.listRecords?limit=100&repo="+url.QueryEscape(did)+"&collection="+url.QueryEscape(collection), &out)
	return len(out.Records)
}

// TestBench_RealClusterThousandInfras applies 1,000 Infras (each one deno contract, its
// record in the owner's repo) to the controllers deployed on the real cluster, with three
// bidders outside it, and prints how long until every one of them was Deployed, the rate in
// contracts per second and the apply-to-Deployed latency. All 1,000 are live at the end
// (1,000 deno guests over the bidders, capacity 340 each). SOCIALWEB_BENCH_LIVE=N keeps at
// most N live instead, for a host without the memory: each Infra is deleted once Deployed
// (its contract released, its record deleted) and the next applied. Every contract must be
// won once: the bidders' logs hold 1,000 guest starts in all.
func TestBench_RealClusterThousandInfras(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	const total = 1000
	live := total
	if v := os.Getenv("SOCIALWEB_BENCH_LIVE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SOCIALWEB_BENCH_LIVE=%q: want a count of Infras", v)
		}
		live = min(n, total)
	}
	rc := startRealCluster(t, 3, "--capacity", "340")
	rc.repo(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", rc.kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	infraNamed := func(i int) *v1alpha1.Infra {
		return &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("bench-%04d", i)},
			Spec: v1alpha1.InfraSpec{Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}},
				Contracts: []v1alpha1.InfraContract{{Name: "api", ComputeKind: v1alpha1.ComputeKindDeno, State: v1alpha1.ContractRequested,
					PolicyArgs: map[string]string{"bidWindowSec": "3"},
					UserData:   `setInterval(() => {}, 1 << 30) // stays up until released`}}}}
	}
	applied := map[string]time.Time{}
	var latencies []time.Duration
	next, deleted := 0, 0
	start := time.Now()
	lastReport := start
	for len(latencies) < total {
		for next < total && next-deleted < live {
			inf := infraNamed(next)
			if err := c.Create(ctx, inf); err != nil {
				t.Fatalf("create %s: %v", inf.Name, err)
			}
			applied[inf.Name] = time.Now()
			next++
		}
		var list v1alpha1.InfraList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		for i := range list.Items {
			inf := &list.Items[i]
			at, ok := applied[inf.Name]
			if !ok || inf.DeletionTimestamp != nil {
				continue
			}
			switch inf.Status.Phase {
			case v1alpha1.InfraDegraded, v1alpha1.InfraReleased:
				t.Fatalf("%s %s before the benchmark released it: %+v", inf.Name, inf.Status.Phase, inf.Status.Contracts)
			case v1alpha1.InfraDeployed:
				latencies = append(latencies, time.Since(at))
				delete(applied, inf.Name)
				if live < total {
					if err := c.Delete(ctx, inf); err != nil && !apierrors.IsNotFound(err) {
						t.Fatal(err)
					}
					deleted++
				}
			}
		}
		if time.Since(lastReport) > 10*time.Second {
			lastReport = time.Now()
			t.Logf("%s: %d of %d Deployed, %d in flight, host memory available %s", time.Since(start).Round(time.Second),
				len(latencies), total, len(applied), memAvailable())
		}
		if time.Since(start) > 30*time.Minute {
			t.Fatalf("after 30 min: %d of %d Deployed", len(latencies), total)
		}
		time.Sleep(250 * time.Millisecond)
	}
	took := time.Since(start)
	slices.Sort(latencies)
	q := func(f float64) time.Duration {
		return latencies[int(f*float64(len(latencies)-1))].Round(time.Millisecond)
	}
	starts := 0
	for _, b := range rc.bidders {
		raw, err := os.ReadFile(b.proc.log)
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(raw), "msg=market_started")
		t.Logf("bidder %s: %d guests started", b.handle, n)
		starts += n
	}
	if starts != total {
		t.Errorf("%d guest starts over the bidders, want %d: one per contract", starts, total)
	}
	t.Logf("%d Infras on the real cluster, 3 bidders, at most %d live at once: all Deployed in %s, %.1f contracts/s; apply to Deployed p50 %s p90 %s p99 %s",
		total, live, took.Round(time.Millisecond), float64(total)/took.Seconds(), q(0.5), q(0.9), q(0.99))
}

// memAvailable is the host's MemAvailable, for the benchmark's progress lines.
func memAvailable() string {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemAvailable:" {
			kb, _ := strconv.Atoi(f[1])
			return fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
		}
	}
	return "?"
}
