package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

const nodePod = `apiVersion: v1
kind: Pod
metadata:
  name: hello
  namespace: default
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo hello from $(hostname); test -x /bin/busybox"]
`

// A tenant cluster gains a real node through the node substrate: a kubelet and containerd
// in a network namespace of their own, joined with a minted bundle through the forwarded
// gate port; the Node registers with its InternalIP and goes Ready, a pod of a locally
// imported image runs to Succeeded, and Stop leaves no process, mount or namespace.
func TestNode_JoinsTenantClusterAndRunsAPod(t *testing.T) {
	t.Parallel()
	const nodeName = "node-a"
	// The bundle's certificate lives a minute: the kubelet must renew it to stay a node.
	tc := joinableCluster(t, "n1", nodeName, time.Minute)
	dir, cl, kc, bundle, images := tc.dir, tc.cl, tc.kc, tc.bundle, tc.images
	state := filepath.Join(t.TempDir(), "nodes")
	s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, ImageDir: images, EgressDeny: testEgressDeny, EgressAllow: testEgressAllow})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)

	ctx := context.Background()
	t0 := time.Now()
	st := bootNode(t, s, "n1-a", nodeName, bundle)
	t.Logf("booted: %s at %s", st.Phase, st.Address)
	dump := func() string {
		var b strings.Builder
		for _, f := range []string{"log", "containerd.log", "kubelet.log"} {
			out, _ := guestproc.Tail(filepath.Join(state, "n1-a", f), 30)
			fmt.Fprintf(&b, "--- %s\n%s\n", f, out)
		}
		return b.String()
	}

	nodeRunsHello(t, nodeJoined{kc: kc, s: s, id: "n1-a", name: nodeName, address: st.Address, booted: t0, dump: dump}, 90*time.Second)

	// The node's own processes are in its cgroups.
	var cgroups []string
	if err := guestproc.ReadJSON(filepath.Join(state, "n1-a", "cgroups.json"), &cgroups); err != nil || len(cgroups) == 0 {
		t.Errorf("cgroups.json: %v %v", err, cgroups)
	}
	for _, d := range cgroups {
		// The node's processes are in the cgroup below its own that roots its cgroup namespace.
		b, _ := os.ReadFile(filepath.Join(d, "node", "cgroup.procs"))
		if n := len(strings.Fields(string(b))); n < 3 {
			t.Errorf("%s holds %d processes, want the agent, containerd and the kubelet at least", d, n)
		}
	}

	// The kubelet renewed its client certificate before the bundle's expired: a CSR for its
	// own name, approved and signed by the cluster, and the node's lease still renewed after
	// the bundle's certificate ended (the lease is the kubelet's heartbeat, every 10 s).
	ts := tenantClient(t, kc)
	testenv.Eventually(t, 90*time.Second, "the node's client certificate renewed through an approved CSR", func() (bool, error) {
		csrs, err := ts.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var seen []string
		for _, r := range csrs.Items {
			approved := false
			for _, c := range r.Status.Conditions {
				approved = approved || (c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue)
			}
			if r.Spec.Username == "system:node:"+nodeName && approved && len(r.Status.Certificate) > 0 {
				return true, nil
			}
			seen = append(seen, fmt.Sprintf("%s by %s approved %v issued %v", r.Name, r.Spec.Username, approved, len(r.Status.Certificate) > 0))
		}
		return false, fmt.Errorf("CSRs %v\n%s", seen, dump())
	})
	testenv.Eventually(t, 90*time.Second, "the node's lease renewed after the bundle's certificate ended", func() (bool, error) {
		l, err := ts.CoordinationV1().Leases("kube-node-lease").Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if l.Spec.RenewTime == nil {
			return false, fmt.Errorf("lease never renewed")
		}
		return l.Spec.RenewTime.After(bundle.NotAfter), fmt.Errorf("lease renewed %s, the bundle ends %s\n%s", l.Spec.RenewTime.UTC(), bundle.NotAfter.UTC(), dump())
	})
	if out, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); out != "True" {
		t.Errorf("after the bundle's certificate ended the node is Ready=%q\n%s", out, dump())
	}

	// A new value over the same state dir (a restarted bidder) finds the node and stops it.
	s2, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, ImageDir: images, EgressDeny: testEgressDeny, EgressAllow: testEgressAllow})
	if err != nil {
		t.Fatal(err)
	}
	if gs, err := s2.List(ctx); err != nil || len(gs) != 1 || gs[0].Phase != substrate.Running || gs[0].Address != st.Address {
		t.Fatalf("restarted substrate lists %+v %v", gs, err)
	}
	t2 := time.Now()
	if err := s2.Stop(ctx, "n1-a"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop in %.2fs", time.Since(t2).Seconds())
	for _, d := range cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left: %v", d, err)
		}
	}
	g, _ := s.Status(ctx, "n1-a")
	if g.Phase != substrate.Stopped {
		t.Errorf("after Stop: %+v", g)
	}
	if pids := substratetest.Procs(state); len(pids) != 0 {
		t.Errorf("processes of the node left: %v", pids)
	}
	agentLog, _ := s.Logs(ctx, "n1-a", 0)
	if !strings.Contains(string(agentLog), "removed 1 pod sandboxes") || !strings.Contains(string(agentLog), "node-agent: stopped") {
		t.Errorf("the agent did not remove the pod and stop in order:\n%s", agentLog)
	}
	// Scoped to this test's nodes: other runs on a shared host have nodes of their own.
	tagA := nodeTag(filepath.Join(state, "n1-a"))
	if pids := inNodeCgroup(tagA, procsWithArg("sleep\x002147483647")); len(pids) != 0 {
		t.Errorf("sandbox (pause) processes left: %v", pids)
	}
	if pids := procsWithArg(state, "/run/swnode/"+tagA); len(pids) != 0 {
		t.Errorf("kubelet or containerd processes left: %v", pids)
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if e.Name() == "swnode-"+tagA || strings.HasPrefix(e.Name(), "cni-") {
			t.Errorf("network namespace left: %s", e.Name())
		}
	}
	if m := mountsUnder(state); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
	if _, err := os.Stat(filepath.Join(state, "n1-a", "work")); !os.IsNotExist(err) {
		t.Errorf("work dir left: %v", err)
	}
	if err := s.Remove(ctx, "n1-a"); err != nil {
		t.Error(err)
	}

	// A node whose agent is killed behind the substrate's back (SIGKILL of its group: no
	// orderly teardown, a pod still running) is reported Failed, and Stop still leaves nothing.
	bundleB, err := tenant.MintNodeBundle(filepath.Join(dir, "tenants"), tenant.Key{Namespace: "default", Name: "n1"}, "node-b", cl.Status.Server, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stB := bootNode(t, s, "n1-b", "node-b", bundleB)
	tkubectl(t, kc, sleeperPod, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "sleeper Running on node-b", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "sleeper", "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
		return out == "Running/node-b", fmt.Errorf("%q", out)
	})
	var cgroupsB []string
	_ = guestproc.ReadJSON(filepath.Join(state, "n1-b", "cgroups.json"), &cgroupsB)
	if err := syscall.Kill(-stB.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "killed node reported ended", func() (bool, error) {
		g, _ := s.Status(ctx, "n1-b")
		return g.Phase.Ended(), fmt.Errorf("%+v", g)
	})
	if g, _ := s.Status(ctx, "n1-b"); g.Phase != substrate.Failed {
		t.Errorf("killed node: %+v, want Failed", g)
	}
	if err := s.Stop(ctx, "n1-b"); err != nil {
		t.Fatal(err)
	}
	tagB := nodeTag(filepath.Join(state, "n1-b"))
	if pids := inNodeCgroup(tagB, procsWithArg("sleep\x002147483647", "sleep\x003600")); len(pids) != 0 {
		t.Errorf("pod processes left after a killed node's Stop: %v", pids)
	}
	if pids := procsWithArg(state, "/run/swnode/"+tagB); len(pids) != 0 {
		t.Errorf("node processes left after a killed node's Stop: %v", pids)
	}
	ents, _ = os.ReadDir("/run/netns")
	for _, e := range ents {
		if e.Name() == "swnode-"+tagB {
			t.Errorf("network namespace left: %s", e.Name())
		}
	}
	for _, d := range cgroupsB {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left: %v", d, err)
		}
	}
	if m := mountsUnder(state); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
}

const sleeperPod = `apiVersion: v1
kind: Pod
metadata:
  name: sleeper
  namespace: default
spec:
  automountServiceAccountToken: false
  nodeSelector: {kubernetes.io/hostname: node-b}
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sleep", "3600"]
`

// tkubectlErr runs kubectl and returns its output and error (for polling).
func tkubectlErr(kubeconfig string, args ...string) (string, error) {
	var stderr strings.Builder
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), err
}

// procsWithArg lists live processes whose argv[0] base name or command line contains one of
// the given strings (containerd and its shims; a kubelet of the socialweb binary).
func procsWithArg(subs ...string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !pidAlive(pid) {
			continue
		}
		for _, s := range subs {
			if strings.Contains(string(b), s) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// nodeJoined is a node guest booted to join a tenant cluster.
type nodeJoined struct {
	kc, id, name, address string
	s                     *node.Substrate
	booted                time.Time
	dump                  func() string // the guest's logs, for failures
}

// nodeRunsHello waits (each step within timeout) until n is a Ready Node with the guest's
// address as its InternalIP, then runs nodePod on it to Succeeded and reads its log back
// through the apiserver, which reaches the kubelet at that address.
func nodeRunsHello(t *testing.T, n nodeJoined, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, "node Ready with its InternalIP", func() (bool, error) {
		if g, _ := n.s.Status(context.Background(), n.id); g.Phase.Ended() {
			t.Fatalf("node guest ended: %+v\n%s", g, n.dump())
		}
		out, _ := tkubectlErr(n.kc, "get", "node", n.name, "-o",
			`jsonpath={.status.addresses[?(@.type=="InternalIP")].address}/{.status.conditions[?(@.type=="Ready")].status}`)
		return out == n.address+"/True", fmt.Errorf("%q\n%s", out, n.dump())
	})
	t.Logf("boot -> node Ready in %.2fs", time.Since(n.booted).Seconds())

	t1 := time.Now()
	tkubectl(t, n.kc, nodePod, "apply", "-f", "-")
	testenv.Eventually(t, timeout, "pod Succeeded", func() (bool, error) {
		out, _ := tkubectlErr(n.kc, "get", "pod", "hello", "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("pod failed: %s\n%s", tkubectl(t, n.kc, "", "get", "pod", "hello", "-o", "yaml"), n.dump())
		}
		return out == "Succeeded/"+n.name, fmt.Errorf("%q\n%s", out, n.dump())
	})
	t.Logf("pod created -> Succeeded in %.2fs", time.Since(t1).Seconds())
	if out, err := tkubectlErr(n.kc, "logs", "hello"); err != nil || !strings.Contains(out, "hello from hello") {
		// apiserver -> kubelet over the InternalIP, through the kubelet's webhook authorization.
		t.Errorf("kubectl logs: %v %q", err, out)
	}
}

// requireNodeHost skips (fails under CI) where tenant control planes or nodes cannot run.
func requireNodeHost(t *testing.T) {
	t.Helper()
	requireTenantHost(t)
	if err := node.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// tenantToJoin is a Ready tenant cluster of a running up, with a join bundle for one node
// and an image dir holding the busybox image.
type tenantToJoin struct {
	dir, kc, images string
	cl              *v1alpha1.Cluster
	bundle          tenant.NodeBundle
}

// joinableCluster starts up, makes the Cluster default/name Ready at zero nodes and mints a
// bundle for nodeName that lives ttl. The Cluster's maxNodes is 0: its nodes are the ones
// the test boots, and a pod pending before they are Ready must not make up's node bidder
// rent one (a node up rents outlives up, as every guest does).
func joinableCluster(t *testing.T, name, nodeName string, ttl time.Duration) tenantToJoin {
	t.Helper()
	tc := joinableClusterArgs(t, name, nil)
	bundle, err := tenant.MintNodeBundle(filepath.Join(tc.dir, "tenants"), tenant.Key{Namespace: "default", Name: name}, nodeName, tc.cl.Status.Server, ttl)
	if err != nil {
		t.Fatal(err)
	}
	tc.bundle = bundle
	return tc
}

// joinableClusterArgs is joinableCluster with up's extra args and no bundle minted.
func joinableClusterArgs(t *testing.T, name string, args []string) tenantToJoin {
	t.Helper()
	requireNodeHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	// Its nodes are booted straight from a substrate, not rented through the market, so the
	// cluster does not require what some of them (vm nodes, the host's runtime) cannot run.
	up := startUp(t, dir, append([]string{"--pod-user-namespaces", "optional"}, args...)...)
	c := coreClient(t, dir)
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: `+name+`, namespace: default}
spec: {account: "`+tenantOwner+`", name: `+name+`, running: true, maxNodes: 0}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: name}, v1alpha1.ClusterReady, 60*time.Second)
	images := t.TempDir()
	if err := node.WriteBusyboxImage(filepath.Join(images, "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	return tenantToJoin{dir: dir, kc: mint(t, dir, cl), images: images, cl: cl}
}

// bootNode boots guest id on s as node nodeName joining with bundle.
func bootNode(t *testing.T, s *node.Substrate, id, nodeName string, bundle tenant.NodeBundle) substrate.GuestStatus {
	t.Helper()
	join, _ := json.Marshal(node.Join{Server: bundle.Server, NodeName: nodeName})
	st, err := s.Boot(context.Background(), substrate.GuestSpec{
		ID: id, UserData: join,
		Secrets: map[string][]byte{node.SecretKubeconfig: bundle.Kubeconfig, node.SecretCA: bundle.CAPEM},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// nodeOptions are what a row's own node differs in; the zero value is a node with the
// host's DNS upstream whose dump tails its agent's and kubelet's logs.
type nodeOptions struct {
	// DNSUpstream is the node's node.Config.DNSUpstream ("none": no upstream).
	DNSUpstream string
	// RuntimeDir is the node's node.Config.RuntimeDir ("": the node runtime beside the
	// binary, else the host's; node.HostRuntime: the host's).
	RuntimeDir string
	// Logs are the files of the guest's state dir the dump tails, Lines lines of each
	// (defaults: log and kubelet.log, 25 lines).
	Logs  []string
	Lines int
	// Events adds the cluster's events to the dump.
	Events bool
	// OverlayAddress and OverlayPorts are node.Config's (publish the node's overlay endpoint
	// on a public address of this host).
	OverlayAddress, OverlayPorts string
	// EgressAllow is added to the test policy's allows.
	EgressAllow []string
}

// readiedNode is a node guest of a substrate of the test's own, Ready in its cluster.
type readiedNode struct {
	S      *node.Substrate
	State  string                // the substrate's state dir
	Status substrate.GuestStatus // as it booted
	Dump   func() string         // the tails of the node's logs, for failure messages
}

// readyNode boots guest id of a substrate of the test's own (removed when the test ends) as
// node nodeName of tc's cluster, with the images in tc.images and the test egress policy,
// and waits for the Node to be Ready.
func readyNode(t *testing.T, tc tenantToJoin, id, nodeName string, o nodeOptions) readiedNode {
	t.Helper()
	if o.Logs == nil {
		o.Logs = []string{"log", "kubelet.log"}
	}
	if o.Lines == 0 {
		o.Lines = 25
	}
	state := filepath.Join(t.TempDir(), "nodes")
	s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, RuntimeDir: o.RuntimeDir, ImageDir: tc.images, DNSUpstream: o.DNSUpstream,
		EgressDeny: testEgressDeny, EgressAllow: append(append([]string(nil), testEgressAllow...), o.EgressAllow...),
		OverlayAddress: o.OverlayAddress, OverlayPorts: o.OverlayPorts})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)
	dir, why, userns := s.Runtime()
	t.Logf("node runtime %q (%s), user namespaces %v", dir, why, userns)
	dump := func() string {
		var b strings.Builder
		for _, f := range o.Logs {
			out, _ := guestproc.Tail(filepath.Join(state, id, f), o.Lines)
			fmt.Fprintf(&b, "--- %s\n%s\n", f, out)
		}
		if o.Events {
			out, _ := tkubectlErr(tc.kc, "get", "events", "-A")
			fmt.Fprintf(&b, "--- events\n%s", out)
		}
		return b.String()
	}
	t0 := time.Now()
	st := bootNode(t, s, id, nodeName, tc.bundle)
	testenv.Eventually(t, 90*time.Second, "node Ready", func() (bool, error) {
		if g, _ := s.Status(context.Background(), id); g.Phase.Ended() {
			t.Fatalf("node guest ended: %+v\n%s", g, dump())
		}
		out, _ := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", fmt.Errorf("%q\n%s", out, dump())
	})
	t.Logf("boot -> node Ready in %.2fs", time.Since(t0).Seconds())
	return readiedNode{S: s, State: state, Status: st, Dump: dump}
}

// nodeTag is the tag of the node guest in dir (its run dir, namespace and cgroup names).
func nodeTag(dir string) string {
	h := sha256.Sum256([]byte(dir))
	return hex.EncodeToString(h[:])[:10]
}

// inNodeCgroup keeps the pids that are in the cgroup of the node of tag: a contained node's
// containers are below it, and a process left in it keeps it from being removed.
func inNodeCgroup(tag string, pids []int) []int {
	var out []int
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), "socialweb-node-"+tag) {
			out = append(out, pid)
		}
	}
	return out
}

// mountsUnder lists the mount points under dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && strings.HasPrefix(fs[4], dir) {
			out = append(out, fs[4])
		}
	}
	return out
}
