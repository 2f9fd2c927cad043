package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// A ComputeContract of computeKind node, created directly with its nodeJoin and the join
// bundle Secret as secretsRef, goes through the market of `socialweb up`: the requester
// writes the join as the payload's userData, up's node bidder wins, receives the bundle's
// kubeconfig and ca over deliverSecrets and boots a node guest; the contract is Held, the
// Node goes Ready in the tenant cluster and a pod of a locally imported image runs to
// Succeeded on it. Released, the guest stops: no kubelet or containerd process, no network
// namespace, no mount is left.
func TestNode_MarketContractJoinsTheTenantCluster(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	dir, state, c, ctx := n.dir, n.state, n.c, n.ctx
	kc := n.cluster("m1", "")
	var cl v1alpha1.Cluster
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "m1"}, &cl); err != nil {
		t.Fatal(err)
	}

	repo := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "owner"},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: app.DefaultHandle}}}
	if err := c.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}

	const nodeName = "node-m"
	b, err := tenant.MintNodeBundle(filepath.Join(dir, "tenants"), tenant.Key{Namespace: "default", Name: "m1"}, nodeName, cl.Status.Server, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m1-join"}, Type: "socialweb.computer/node-join", Data: b.Data()}
	if err := c.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	cc := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m1-node"},
		Spec: v1alpha1.ComputeContractSpec{VMName: nodeName, ComputeKind: v1alpha1.ComputeKindNode,
			NodeJoin:   &v1alpha1.NodeJoin{Server: cl.Status.Server, NodeName: nodeName, BundleSecretRef: &v1alpha1.SecretKeyRef{Name: sec.Name}},
			SecretsRef: &v1alpha1.SecretKeyRef{Name: sec.Name}, RepoRef: &v1alpha1.ObjectRef{Name: "owner"},
			PolicyArgs: map[string]string{"bidWindowSec": "2", "answerTimeoutSec": "20"}}}
	t0 := time.Now()
	if err := c.Create(ctx, cc); err != nil {
		t.Fatal(err)
	}
	dump := func() string {
		var s strings.Builder
		ents, _ := os.ReadDir(state)
		for _, e := range ents {
			for _, f := range []string{"log", "kubelet.log"} {
				out, _ := guestproc.Tail(filepath.Join(state, e.Name(), f), 20)
				fmt.Fprintf(&s, "--- %s/%s\n%s\n", e.Name(), f, out)
			}
		}
		if b, err := os.ReadFile(filepath.Join(dir, "logs", "socialweb.log")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, app.LocalNodeBidderHandle) || strings.Contains(l, "m1-node") {
					fmt.Fprintln(&s, l)
				}
			}
		}
		return s.String()
	}
	ckKey := client.ObjectKeyFromObject(cc)
	testenv.Eventually(t, 60*time.Second, "ComputeContract Held by the node bidder", func() (bool, error) {
		if err := c.Get(ctx, ckKey, cc); err != nil {
			return false, err
		}
		if cc.Status.Phase == v1alpha1.ComputeContractFailed {
			t.Fatalf("contract Failed: %s\n%s", cc.Status.Message, dump())
		}
		return cc.Status.Phase == v1alpha1.ComputeContractHeld, fmt.Errorf("%s %q", cc.Status.Phase, cc.Status.Message)
	})
	if cc.Status.Winner != n.bidder {
		t.Errorf("winner %s, want the node bidder %s", cc.Status.Winner, n.bidder)
	}
	if d := meta.FindStatusCondition(cc.Status.Conditions, string(v1alpha1.ConditionSecretsDelivered)); d == nil || d.Status != metav1.ConditionTrue {
		t.Errorf("SecretsDelivered: %+v", d)
	}
	t.Logf("contract -> Held in %.2fs", time.Since(t0).Seconds())

	testenv.Eventually(t, 90*time.Second, "node Ready", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", fmt.Errorf("%q\n%s", out, dump())
	})
	t.Logf("contract -> node Ready in %.2fs", time.Since(t0).Seconds())

	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "pod Succeeded", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "hello", "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("pod failed: %s\n%s", tkubectl(t, kc, "", "get", "pod", "hello", "-o", "yaml"), dump())
		}
		return out == "Succeeded/"+nodeName, fmt.Errorf("%q\n%s", out, dump())
	})

	if g := n.guests(); g != 1 {
		t.Fatalf("%d node guests in %s, want 1", g, state)
	}

	// Release: the requester deletes the contract on the market, the bidder stops the node.
	if err := c.Get(ctx, ckKey, cc); err != nil {
		t.Fatal(err)
	}
	cc.Spec.Release = &v1alpha1.ContractRelease{RequestedAt: metav1.Now()}
	if err := c.Update(ctx, cc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "ComputeContract Released", func() (bool, error) {
		err := c.Get(ctx, ckKey, cc)
		return err == nil && cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("%s %q %v", cc.Status.Phase, cc.Status.Message, err)
	})
	n.waitGuestsGone(30 * time.Second)
	if err := c.Delete(ctx, cc); err != nil {
		t.Fatal(err)
	}
}

// nodeUp is a `socialweb up` whose node bidder rents node guests, for the ACC31 rows: its
// data dir, the node bidder's state dir, a client of its core, and the tags of every node
// guest seen so far (run dirs and network namespaces are named by them).
type nodeUp struct {
	t     *testing.T
	dir   string
	state string
	up    *upProc
	// bidder is the node bidder's DID.
	bidder string
	c      client.Client
	ctx    context.Context
	tags   map[string]string // guest dir -> tag
}

// startNodeUp starts up with its node bidder and the busybox image in the bidder's image
// dir; a cleanup registered before up stops any node a failure left.
func startNodeUp(t *testing.T, args ...string) *nodeUp {
	t.Helper()
	return startNodeUpWith(t, nil, args...)
}

// startNodeUpWith is startNodeUp with up's command adjusted by with (startUpWith).
func startNodeUpWith(t *testing.T, with func(*exec.Cmd), args ...string) *nodeUp {
	t.Helper()
	requireNodeHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	n := &nodeUp{t: t, dir: dir, state: filepath.Join(dir, "node-bidder", "guests"), ctx: context.Background(), tags: map[string]string{}}
	t.Cleanup(func() {
		s, err := node.New(node.Config{StateDir: n.state, Binary: socialwebBin})
		if err != nil {
			t.Error(err)
			return
		}
		substratetest.Cleanup(t, s, n.state)
	})
	n.up = startUpWith(t, dir, with, args...)
	n.bidder = n.up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	n.c = coreClient(t, dir)
	return n
}

// cluster applies a Cluster in default with the given extra spec fields (YAML flow, e.g.
// "maxNodes: 1, scaleHold: 3s"), waits until it is Ready and checks it has no node; it
// returns a kubeconfig of the tenant.
func (n *nodeUp) cluster(name, spec string) string {
	t := n.t
	t.Helper()
	n.up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: `+name+`, namespace: default}
spec: {account: "`+tenantOwner+`", name: `+name+`, running: true`+strings.TrimSuffix(", "+spec, ", ")+`}
`, "apply", "-f", "-")
	cl := waitPhase(t, n.c, client.ObjectKey{Namespace: "default", Name: name}, v1alpha1.ClusterReady, 60*time.Second)
	kc := mint(t, n.dir, cl)
	if out, _ := tkubectlErr(kc, "get", "nodes", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Fatalf("nodes before any pod: %q", out)
	}
	return kc
}

// claims are the NodeClaims of the Cluster named cluster, by node name.
func (n *nodeUp) claims(cluster string) map[string]v1alpha1.NodeClaim {
	var l v1alpha1.NodeClaimList
	if err := n.c.List(n.ctx, &l, client.InNamespace("default")); err != nil {
		n.t.Fatal(err)
	}
	out := map[string]v1alpha1.NodeClaim{}
	for _, nc := range l.Items {
		if nc.Spec.ClusterRef.Name == cluster {
			out[nc.Spec.NodeName] = nc
		}
	}
	return out
}

// waitClaimsRunning waits until the cluster has exactly want claims, all Running, and fails
// at once on more claims or an ended one.
func (n *nodeUp) waitClaimsRunning(cluster string, want int, timeout time.Duration) map[string]v1alpha1.NodeClaim {
	t := n.t
	t.Helper()
	var cs map[string]v1alpha1.NodeClaim
	testenv.Eventually(t, timeout, fmt.Sprintf("%d NodeClaim(s) Running", want), func() (bool, error) {
		cs = n.claims(cluster)
		if len(cs) > want {
			t.Fatalf("%d claims, want %d\n%s", len(cs), want, n.dump())
		}
		running := 0
		for _, c := range cs {
			if c.Status.Phase == v1alpha1.NodeClaimFailed || c.Status.Phase == v1alpha1.NodeClaimLost {
				t.Fatalf("claim %s %s: %s\n%s", c.Name, c.Status.Phase, c.Status.Message, n.dump())
			}
			if c.Status.Phase == v1alpha1.NodeClaimRunning {
				running++
			}
		}
		return len(cs) == want && running == want, lazyErr(func() string {
			return fmt.Sprintf("%d claims, %d Running\n%s", len(cs), running, n.dump())
		})
	})
	n.guests()
	return cs
}

// lazyErr is an error whose message is made only when read (a polled condition's last
// error is read once, on failure).
type lazyErr func() string

func (e lazyErr) Error() string { return e() }

// dump is what up logged about claims, the node host and the node bidder.
func (n *nodeUp) dump() string {
	var s strings.Builder
	if b, err := os.ReadFile(filepath.Join(n.dir, "logs", "socialweb.log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "nodeclaim") || strings.Contains(l, "nodehost") || strings.Contains(l, app.LocalNodeBidderHandle) || strings.Contains(l, "computecontract_phase") {
				fmt.Fprintln(&s, l)
			}
		}
	}
	return s.String()
}

// guests records the node guests now in the bidder's state dir and returns their count.
func (n *nodeUp) guests() int {
	ids, err := filepath.Glob(filepath.Join(n.state, "g*")) // bidder.GuestID; .images is the sandbox image
	if err != nil {
		n.t.Fatal(err)
	}
	for _, id := range ids {
		h := sha256.Sum256([]byte(id))
		n.tags[id] = hex.EncodeToString(h[:])[:10]
	}
	return len(ids)
}

// guestProcs are the live processes of the node guests seen so far (kubelet, containerd,
// shims, pods), found by the bidder's state dir or their run dir in their command line.
func (n *nodeUp) guestProcs(only ...string) []int {
	subs := []string{}
	for id, tag := range n.tags {
		if len(only) == 0 || slices.Contains(only, id) {
			subs = append(subs, id, "/run/swnode/"+tag)
		}
	}
	if len(only) == 0 {
		subs = append(subs, n.state)
	}
	return procsWithArg(subs...)
}

// waitGuestsGone waits until the guests (all seen so far without ids) have no process left
// and checks they left no run dir, network namespace, veth, iptables chain or rule, cgroup
// or mount.
func (n *nodeUp) waitGuestsGone(timeout time.Duration, ids ...string) {
	t := n.t
	t.Helper()
	testenv.Eventually(t, timeout, "no node guest process left", func() (bool, error) {
		pids := n.guestProcs(ids...)
		return len(pids) == 0, fmt.Errorf("left: %v", pids)
	})
	for id, tag := range n.tags {
		if len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		if left := hostStateOf(tag); len(left) != 0 {
			t.Errorf("node guest %s left on the host: %s", id, strings.Join(left, ", "))
		}
		if m := mountsUnder(id); len(m) != 0 {
			t.Errorf("mounts left: %v", m)
		}
	}
}

// guestOf is the guest dir of the node named nodeName: the one whose node.json names it.
func (n *nodeUp) guestOf(nodeName string) string {
	n.t.Helper()
	n.guests()
	for id := range n.tags {
		if b, err := os.ReadFile(filepath.Join(id, "node.json")); err == nil && strings.Contains(string(b), `"`+nodeName+`"`) {
			return id
		}
	}
	n.t.Fatalf("no guest of node %s in %v", nodeName, n.tags)
	return ""
}

// contractOf reads the ComputeContract of a claim from its status.infra.
func (n *nodeUp) contractOf(claim v1alpha1.NodeClaim) (v1alpha1.ComputeContract, client.ObjectKey) {
	n.t.Helper()
	if claim.Status.Infra == nil || claim.Status.Infra.ComputeContract == "" {
		n.t.Fatalf("claim %s status.infra: %+v", claim.Name, claim.Status.Infra)
	}
	key := client.ObjectKey{Namespace: claim.Status.Infra.Workspace, Name: claim.Status.Infra.ComputeContract}
	var cc v1alpha1.ComputeContract
	if err := n.c.Get(n.ctx, key, &cc); err != nil {
		n.t.Fatal(err)
	}
	return cc, key
}

// waitPod waits for the pod's phase and node (node "" takes any) and returns its node.
func waitPod(t *testing.T, kc, pod, phase, nodeName string, timeout time.Duration) string {
	t.Helper()
	var got string
	testenv.Eventually(t, timeout, "pod "+pod+" "+phase, func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", pod, "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
		if strings.HasPrefix(out, "Failed") && phase != "Failed" {
			t.Fatalf("pod %s failed: %s", pod, tkubectl(t, kc, "", "get", "pod", pod, "-o", "yaml"))
		}
		p, nn, _ := strings.Cut(out, "/")
		got = nn
		return p == phase && nn != "" && (nodeName == "" || nn == nodeName), fmt.Errorf("%q", out)
	})
	return got
}

// ACC31: a tenant cluster Ready at zero nodes scales up by one for a pending pod and back
// down once the pod is gone, with every part real: the node host claims a node, the NodeClaim
// controller mints the join bundle and composes the cluster's Infra entry, the Infra
// controller makes the node contract (its requester up's node-requester repo), up's node
// bidder wins it and boots a node guest that joins; the claim is Running and the pod runs to
// Succeeded on the node. Deleted, the pod leaves the node empty: after scaleHold the claim
// goes, the contract is released, and the node leaves no process or network namespace.
func TestACC31_ScaleUpOne(t *testing.T) {
	t.Parallel()
	scaleUpOne(t, startNodeUp(t), node.FlavourNamespace)
}

// The same row with up's node bidder running vm-flavoured nodes: the node the market rents
// is a qemu microVM (TCG on this host: tens of seconds to a Node).
func TestACC31_ScaleUpOne_VMFlavour(t *testing.T) {
	t.Parallel()
	img := vmNodeRow(t)
	n := startNodeUp(t, "--node-flavour", node.FlavourVM, "--vm-image", img)
	scaleUpOne(t, n, node.FlavourVM)
}

func scaleUpOne(t *testing.T, n *nodeUp, flavour string) {
	kc := n.cluster("s1", "maxNodes: 1, scaleHold: 3s")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		pod, _ := tkubectlErr(kc, "get", "pod", "hello", "-o", "yaml")
		nodes, _ := tkubectlErr(kc, "get", "nodes", "-o", "wide")
		var logs strings.Builder
		serials, _ := filepath.Glob(filepath.Join(n.state, "g*", "serial.log"))
		for _, f := range serials {
			out, _ := guestproc.Tail(f, 80)
			fmt.Fprintf(&logs, "--- %s\n%s\n", f, out)
		}
		t.Logf("pod:\n%s\nnodes:\n%s\n%s", pod, nodes, logs.String())
	})

	t0 := time.Now()
	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("s1", 1, 120*time.Second) {
		claim = c
	}
	t.Logf("pod -> claim Running in %.2fs", time.Since(t0).Seconds())
	// Under TCG a vm node starts its kubelet, kube-proxy, DNS server and NetworkPolicy in
	// tens of seconds each on a loaded host.
	podTimeout := 90 * time.Second
	if flavour == node.FlavourVM {
		podTimeout = 5 * time.Minute
	}
	waitPod(t, kc, "hello", "Succeeded", claim.Spec.NodeName, podTimeout)
	t.Logf("pod -> Succeeded in %.2fs", time.Since(t0).Seconds())
	cc, ccKey := n.contractOf(claim)
	if cc.Spec.ComputeKind != v1alpha1.ComputeKindNode || cc.Spec.RepoRef == nil || cc.Spec.RepoRef.Name != infra.NodeRequesterRepo {
		t.Errorf("contract spec: %+v", cc.Spec)
	}
	if w := cc.Spec.PolicyArgs[market.ArgBidWindow]; w != "2" {
		t.Errorf("bid window %q, want up's default 2", w)
	}
	if g := n.guests(); g != 1 {
		t.Fatalf("%d node guests, want 1", g)
	}
	ids, _ := filepath.Glob(filepath.Join(n.state, "g*", "node.json"))
	var ns struct {
		Flavour string `json:"flavour"`
	}
	if len(ids) != 1 || guestproc.ReadJSON(ids[0], &ns) != nil || (ns.Flavour != flavour && !(ns.Flavour == "" && flavour == node.FlavourNamespace)) {
		t.Errorf("the node guest's flavour is %q (%v), want %s", ns.Flavour, ids, flavour)
	}
	nodeAdvertisesItsContract(t, kc, claim.Spec.NodeName, ids[0])

	tkubectl(t, kc, "", "delete", "pod", "hello")
	t1 := time.Now()
	testenv.Eventually(t, 90*time.Second, "the claim gone", func() (bool, error) {
		cs := n.claims("s1")
		return len(cs) == 0, lazyErr(func() string { return fmt.Sprintf("%d claims\n%s", len(cs), n.dump()) })
	})
	t.Logf("pod deleted -> claim gone in %.2fs", time.Since(t1).Seconds())
	testenv.Eventually(t, 60*time.Second, "the contract released", func() (bool, error) {
		err := n.c.Get(n.ctx, ccKey, &cc)
		if apierrors.IsNotFound(err) {
			return true, nil // released, then deleted by the Infra controller
		}
		return err == nil && cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("%s %v", cc.Status.Phase, err)
	})
	n.waitGuestsGone(30 * time.Second)
}

// spreadPod is a long-running pod that takes a node of its own (anti-affinity on the
// hostname with the other pods of app=spread), so two of them need two nodes.
func spreadPod(name string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default, labels: {app: spread}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: spread}}
        topologyKey: kubernetes.io/hostname
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sleep", "3600"]
`
}

// nodesReady maps each registered node of the tenant to its Ready condition's status.
func nodesReady(kc string) map[string]string {
	out, _ := tkubectlErr(kc, "get", "nodes", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}`)
	m := map[string]string{}
	for _, f := range strings.Fields(out) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// infraOf reads the nodes Infra of the Cluster default/cluster from the gateway workspace.
func (n *nodeUp) infraOf(cluster string) (*v1alpha1.Infra, error) {
	var inf v1alpha1.Infra
	err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "gateway", Name: infra.ClusterInfraName("default", cluster)}, &inf)
	return &inf, err
}

// ACC31 SCALE-UP-TWO, SCALE-IN-ONE and CLUSTER-DELETE, one after the other on one cluster
// (maxNodes 2, podsPerNode 1, scaleHold 3s):
//
//   - two pods that each need a node of their own: two NodeClaims, one Infra with two
//     entries Requested and Deployed, each ComputeContract owned by the Infra and carrying
//     nodeJoin and the join bundle as secretsRef; both claims Running with status.infra,
//     both nodes Ready, both pods Running, one per node;
//   - one pod deleted: after the hold its claim goes, its entry is Released then dropped and
//     its guest leaves nothing; the other node, claim and contract keep their uid and stay
//     Ready; the released node leaves the tenant;
//   - the Cluster deleted: its Infra is Terminating with the release finalizer, the contract
//     is released, the claims, the Infra and the Cluster go, and no guest is left.
func TestACC31_ScaleUpTwoThenInOneThenClusterDelete(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	kc := n.cluster("s2", "maxNodes: 2, podsPerNode: 1, scaleHold: 3s")

	// SCALE-UP-TWO
	t0 := time.Now()
	tkubectl(t, kc, spreadPod("w1")+"---\n"+spreadPod("w2"), "apply", "-f", "-")
	claims := n.waitClaimsRunning("s2", 2, 120*time.Second)
	t.Logf("two pods -> two claims Running in %.2fs", time.Since(t0).Seconds())
	inf, err := n.infraOf("s2")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the Infra Deployed 2/2 with two Requested entries", func() (bool, error) {
		inf, err = n.infraOf("s2")
		if err != nil {
			return false, err
		}
		requested := 0
		for _, k := range inf.Spec.Contracts {
			if k.State == v1alpha1.ContractRequested && k.ComputeKind == v1alpha1.ComputeKindNode {
				requested++
			}
		}
		return len(inf.Spec.Contracts) == 2 && requested == 2 && inf.Status.Phase == v1alpha1.InfraDeployed && inf.Status.ContractsReady == "2/2",
			fmt.Errorf("%d entries, %d Requested, %s %s", len(inf.Spec.Contracts), requested, inf.Status.Phase, inf.Status.ContractsReady)
	})
	contracts := map[string]v1alpha1.ComputeContract{} // by node name
	for nodeName, claim := range claims {
		cc, _ := n.contractOf(claim)
		if ref := metav1.GetControllerOf(&cc); ref == nil || ref.Kind != "Infra" || ref.UID != inf.UID {
			t.Errorf("contract %s controller %v, want the Infra %s", cc.Name, ref, inf.UID)
		}
		if cc.Spec.NodeJoin == nil || cc.Spec.NodeJoin.NodeName != nodeName || cc.Spec.NodeJoin.BundleSecretRef == nil ||
			cc.Spec.SecretsRef == nil || cc.Spec.SecretsRef.Name != cc.Spec.NodeJoin.BundleSecretRef.Name {
			t.Errorf("contract %s nodeJoin %+v secretsRef %+v", cc.Name, cc.Spec.NodeJoin, cc.Spec.SecretsRef)
		}
		if claim.Status.Infra.Name != inf.Name || claim.Status.Infra.Workspace != "gateway" {
			t.Errorf("claim %s status.infra %+v", claim.Name, claim.Status.Infra)
		}
		contracts[nodeName] = cc
	}
	testenv.Eventually(t, 30*time.Second, "both nodes Ready", func() (bool, error) {
		ready := nodesReady(kc)
		ok := len(ready) == 2
		for nodeName := range claims {
			ok = ok && ready[nodeName] == "True"
		}
		return ok, fmt.Errorf("%v", ready)
	})
	on1 := waitPod(t, kc, "w1", "Running", "", 60*time.Second)
	on2 := waitPod(t, kc, "w2", "Running", "", 60*time.Second)
	if on1 == on2 || claims[on1].Name == "" || claims[on2].Name == "" {
		t.Fatalf("pods on %s and %s, claims %v", on1, on2, claims)
	}
	t.Logf("two pods -> Running in %.2fs", time.Since(t0).Seconds())
	if g := n.guests(); g != 2 {
		t.Fatalf("%d node guests, want 2", g)
	}

	// SCALE-IN-ONE: w2's node goes, w1's stays.
	gone, kept := claims[on2], claims[on1]
	goneGuest := n.guestOf(on2)
	entry := gone.Status.Infra.Contract
	t1 := time.Now()
	tkubectl(t, kc, "", "delete", "pod", "w2", "--wait=false")
	var seen []v1alpha1.ContractState
	testenv.Eventually(t, 90*time.Second, "the released node's entry dropped", func() (bool, error) {
		inf, err := n.infraOf("s2")
		if err != nil {
			return false, err
		}
		for _, k := range inf.Spec.Contracts {
			if k.Name == entry {
				if len(seen) == 0 || seen[len(seen)-1] != k.State {
					seen = append(seen, k.State)
				}
				return false, fmt.Errorf("entry %s", k.State)
			}
		}
		return true, nil
	})
	if !slices.Equal(seen, []v1alpha1.ContractState{v1alpha1.ContractRequested, v1alpha1.ContractReleased}) {
		t.Errorf("entry states seen %v, want Requested then Released", seen)
	}
	testenv.Eventually(t, 30*time.Second, "the released claim gone", func() (bool, error) {
		cs := n.claims("s2")
		_, still := cs[on2]
		return !still && len(cs) == 1, fmt.Errorf("%d claims", len(cs))
	})
	t.Logf("pod deleted -> claim gone in %.2fs", time.Since(t1).Seconds())
	n.waitGuestsGone(30*time.Second, goneGuest)
	testenv.Eventually(t, 30*time.Second, "the released node gone from the tenant", func() (bool, error) {
		ready := nodesReady(kc)
		_, still := ready[on2]
		return !still, lazyErr(func() string { return fmt.Sprintf("%v\n%s", ready, n.dump()) })
	})
	now := n.claims("s2")[on1]
	if now.UID != kept.UID || now.Status.Phase != v1alpha1.NodeClaimRunning {
		t.Errorf("kept claim %s uid %s -> %s, phase %s", kept.Name, kept.UID, now.UID, now.Status.Phase)
	}
	cc, _ := n.contractOf(now)
	if cc.UID != contracts[on1].UID || cc.Status.Phase != v1alpha1.ComputeContractHeld {
		t.Errorf("kept contract %s uid %s -> %s, phase %s", cc.Name, contracts[on1].UID, cc.UID, cc.Status.Phase)
	}
	if r := nodesReady(kc); r[on1] != "True" {
		t.Errorf("kept node %s: %v", on1, r)
	}
	if len(n.guestProcs(n.guestOf(on1))) == 0 {
		t.Errorf("the kept node %s has no process", on1)
	}

	// CLUSTER-DELETE
	var cl v1alpha1.Cluster
	if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "s2"}, &cl); err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	if err := n.c.Delete(n.ctx, &cl); err != nil {
		t.Fatal(err)
	}
	terminating := false
	testenv.Eventually(t, 90*time.Second, "the Infra gone", func() (bool, error) {
		inf, err := n.infraOf("s2")
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err == nil && inf.DeletionTimestamp != nil && slices.Contains(inf.Finalizers, v1alpha1.FinalizerInfraRelease) {
			terminating = true
		}
		return false, fmt.Errorf("%v %s %v", err, inf.Status.Phase, inf.Finalizers)
	})
	if !terminating {
		t.Error("the Infra was never seen Terminating with its release finalizer")
	}
	ccKey := client.ObjectKeyFromObject(&cc)
	testenv.Eventually(t, 30*time.Second, "the contract released and gone", func() (bool, error) {
		err := n.c.Get(n.ctx, ccKey, &cc)
		return apierrors.IsNotFound(err), fmt.Errorf("%s %v", cc.Status.Phase, err)
	})
	testenv.Eventually(t, 60*time.Second, "the claims and the Cluster gone", func() (bool, error) {
		cs := n.claims("s2")
		err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "s2"}, &cl)
		return len(cs) == 0 && apierrors.IsNotFound(err), fmt.Errorf("%d claims, cluster %v", len(cs), err)
	})
	t.Logf("cluster deleted -> claims, Infra and Cluster gone in %.2fs", time.Since(t2).Seconds())
	n.waitGuestsGone(30 * time.Second)
}

// runnerPod is shaped like a GitLab Runner Kubernetes-executor job pod: a bare pod (no Job)
// with a build and a helper container sharing the builds volume, restartPolicy Never, and
// the runner's labels and annotations.
const runnerPod = `apiVersion: v1
kind: Pod
metadata:
  name: runner-x1y2z3-project-42-concurrent-0-a1b2c
  namespace: default
  labels:
    pod: runner-x1y2z3-project-42-concurrent-0
    manager.runner.gitlab.com/name: socialweb-runner
    manager.runner.gitlab.com/id-short: x1y2z3
    job.runner.gitlab.com/id: "1001"
    job.runner.gitlab.com/name: build
    job.runner.gitlab.com/ref: main
    job.runner.gitlab.com/sha: 0123456789abcdef0123456789abcdef01234567
    project.runner.gitlab.com/id: "42"
  annotations:
    job.runner.gitlab.com/url: https://gitlab.example/group/project/-/jobs/1001
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  volumes:
  - name: repo
    emptyDir: {}
  containers:
  - name: build
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "for i in $(seq 100); do [ -f /builds/fetched ] && break; sleep 0.1; done; cat /builds/fetched && echo job succeeded"]
    volumeMounts: [{name: repo, mountPath: /builds}]
  - name: helper
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo sources fetched > /builds/fetched; echo helper done"]
    volumeMounts: [{name: repo, mountPath: /builds}]
`

// ACC31 GitLab-runner job and GATEWAY-ROOT-DELETE, on one up:
//
//   - a job pod shaped like GitLab Runner's (build and helper containers, restartPolicy
//     Never, runner labels) on a cluster at zero nodes gets a node rented for it and reaches
//     Succeeded there; then the cluster returns to zero nodes: no claim, no Infra, no Node in
//     the tenant, status.nodes 0, no guest;
//   - with a node rented again for a long-running pod, `socialweb workspace delete gateway`
//     (the gateway root) deletes the Cluster first, then what is left of the gateway
//     workspace, within its timeout, and leaves no Cluster, claim, Infra, contract or guest.
func TestACC31_GitLabRunnerJobThenGatewayRootDelete(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	// The job's logs are read once it Succeeded, from its node: the hold must outlast the
	// poll that sees Succeeded and two kubectl calls on a loaded host (3 s did not, in a run
	// of rows in parallel: the node was released and its tunnel refused).
	kc := n.cluster("g1", "maxNodes: 1, scaleHold: 15s")
	const job = "runner-x1y2z3-project-42-concurrent-0-a1b2c"

	t0 := time.Now()
	tkubectl(t, kc, runnerPod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("g1", 1, 120*time.Second) {
		claim = c
	}
	waitPod(t, kc, job, "Succeeded", claim.Spec.NodeName, 90*time.Second)
	t.Logf("job pod -> Succeeded on a rented node in %.2fs", time.Since(t0).Seconds())
	if out, err := tkubectlErr(kc, "logs", job, "-c", "build"); err != nil || !strings.Contains(out, "sources fetched") || !strings.Contains(out, "job succeeded") {
		t.Errorf("build log: %v %q", err, out)
	}
	if out, err := tkubectlErr(kc, "logs", job, "-c", "helper"); err != nil || !strings.Contains(out, "helper done") {
		t.Errorf("helper log: %v %q", err, out)
	}

	t1 := time.Now()
	testenv.Eventually(t, 90*time.Second, "the cluster back at zero nodes", func() (bool, error) {
		cs := n.claims("g1")
		_, infErr := n.infraOf("g1")
		nodes := nodesReady(kc)
		var cl v1alpha1.Cluster
		err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "g1"}, &cl)
		return err == nil && len(cs) == 0 && apierrors.IsNotFound(infErr) && len(nodes) == 0 && cl.Status.Nodes == 0,
			fmt.Errorf("%d claims, Infra %v, nodes %v, status.nodes %d, %v", len(cs), infErr, nodes, cl.Status.Nodes, err)
	})
	t.Logf("job Succeeded -> zero nodes in %.2fs", time.Since(t1).Seconds())
	n.waitGuestsGone(30 * time.Second)

	// GATEWAY-ROOT-DELETE
	tkubectl(t, kc, spreadPod("keep"), "apply", "-f", "-")
	n.waitClaimsRunning("g1", 1, 120*time.Second)
	waitPod(t, kc, "keep", "Running", "", 60*time.Second)
	if len(n.guestProcs()) == 0 {
		t.Fatal("no node guest process before the root's deletion")
	}
	t2 := time.Now()
	out, code := runCLI(t, "workspace", "delete", "gateway", "--timeout", "50s", "--kubeconfig", filepath.Join(n.dir, "kubeconfig"))
	t.Logf("workspace delete gateway: exit %d in %.2fs\n%s", code, time.Since(t2).Seconds(), out)
	if code != 0 || !strings.Contains(out, "1 cluster(s) and 1 node claim(s) going") || !strings.Contains(out, "workspace gateway deleted") {
		t.Fatalf("workspace delete gateway: exit %d\n%s\n%s", code, out, n.dump())
	}
	if i, j := strings.Index(out, "cluster(s)"), strings.Index(out, "repo(s) and secret(s) going"); j >= 0 && i > j {
		t.Errorf("the clusters did not go first:\n%s", out)
	}
	var clusters v1alpha1.ClusterList
	var claims v1alpha1.NodeClaimList
	var infras v1alpha1.InfraList
	var contracts v1alpha1.ComputeContractList
	var secrets corev1.SecretList
	for _, l := range []client.ObjectList{&clusters, &claims} {
		if err := n.c.List(n.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []client.ObjectList{&infras, &contracts, &secrets} {
		if err := n.c.List(n.ctx, l, client.InNamespace("gateway")); err != nil {
			t.Fatal(err)
		}
	}
	if len(clusters.Items)+len(claims.Items)+len(infras.Items)+len(contracts.Items)+len(secrets.Items) != 0 {
		t.Errorf("left: %d clusters, %d claims, %d infras, %d contracts, %d secrets", len(clusters.Items), len(claims.Items),
			len(infras.Items), len(contracts.Items), len(secrets.Items))
	}
	if pids := n.guestProcs(); len(pids) != 0 {
		t.Errorf("node guest processes left once the root is deleted: %v", pids)
	}
	n.waitGuestsGone(10 * time.Second)
	if pids := controlPlanesRunning(n.dir); len(pids) != 0 {
		t.Errorf("control planes left: %v", pids)
	}
}

// keeperDeployment runs one long-lived pod that its ReplicaSet brings back wherever it goes.
const keeperDeployment = `apiVersion: apps/v1
kind: Deployment
metadata: {name: keeper, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: keeper}}
  template:
    metadata: {labels: {app: keeper}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: ` + node.BusyboxImage + `
        imagePullPolicy: Never
        command: ["/bin/sleep", "3600"]
`

// keeperPod is the keeper Deployment's pod that is not being deleted, as "phase/node"; ""
// when there is none, and all of them when there are several.
func keeperPod(kc string) string {
	out, _ := tkubectlErr(kc, "get", "pods", "-l", "app=keeper", "-o",
		`jsonpath={range .items[*]}{.status.phase}/{.spec.nodeName}/{.metadata.deletionTimestamp} {end}`)
	var live []string
	for _, f := range strings.Fields(out) {
		if p := strings.SplitN(f, "/", 3); len(p) == 3 && p[2] == "" {
			live = append(live, p[0]+"/"+p[1])
		}
	}
	return strings.Join(live, " ")
}

// A node that dies behind the market's back (its agent's process group killed: no release,
// a Deployment's pod on it) is Lost: its bidder reports the guest ended, the claim goes Lost
// with a message, the node's credentials are refused from then on, and after the node host's hold on ended claims the claim and its Node go.
// The orphaned pod comes back from its ReplicaSet, Pending, and the cluster rents a new node
// where it runs. Nothing of the dead node is left.
func TestACC31_LostNodeIsReplaced(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	kc := n.cluster("l1", "maxNodes: 1, scaleHold: 3s")
	tkubectl(t, kc, keeperDeployment, "apply", "-f", "-")
	var first v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("l1", 1, 120*time.Second) {
		first = c
	}
	testenv.Eventually(t, 60*time.Second, "keeper Running on the first node", func() (bool, error) {
		p := keeperPod(kc)
		return p == "Running/"+first.Spec.NodeName, fmt.Errorf("%q", p)
	})
	// The node's bundle, as a tenant inside its guest could have copied it.
	var bundle corev1.Secret
	key := client.ObjectKey{Namespace: first.Status.Infra.Workspace, Name: infra.NodeBundleSecretName(first.Status.Infra.Name, first.Status.Infra.Contract)}
	if err := n.c.Get(context.Background(), key, &bundle); err != nil {
		t.Fatal(err)
	}
	kept := bundle.Data[tenant.BundleKeyKubeconfig]
	cert, caPool, gateAddr := nodeCredentials(t, kept)
	attacks := nodeAttacks(clientsetFromKubeconfig(t, kept), first.Spec.NodeName, cert, caPool, gateAddr)

	guest := n.guestOf(first.Spec.NodeName)
	var rec guestproc.Record
	if err := guestproc.ReadJSON(filepath.Join(guest, guestproc.PidFile), &rec); err != nil || rec.PID <= 0 {
		t.Fatalf("the node guest's pid.json: %+v %v", rec, err)
	}
	t0 := time.Now()
	if err := syscall.Kill(-rec.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 60*time.Second, "the dead node's claim Lost", func() (bool, error) {
		c, ok := n.claims("l1")[first.Spec.NodeName]
		return ok && c.Status.Phase == v1alpha1.NodeClaimLost && c.Status.Message != "", lazyErr(func() string {
			return fmt.Sprintf("%s %q\n%s", c.Status.Phase, c.Status.Message, n.dump())
		})
	})
	t.Logf("node killed -> claim Lost in %.2fs: %s", time.Since(t0).Seconds(), n.claims("l1")[first.Spec.NodeName].Status.Message)
	// Its credentials stop with the claim's end, not when the claim is deleted later.
	testenv.Eventually(t, 10*time.Second, "the lost node's credentials refused", func() (bool, error) {
		for _, a := range attacks {
			if err := a.run(context.Background()); !apierrors.IsUnauthorized(err) && !apierrors.IsForbidden(err) && !isTunnelRefusal(err) {
				return false, fmt.Errorf("%s: %v, want refused (claims: %v)", a.what, err, slices.Collect(maps.Keys(n.claims("l1"))))
			}
		}
		return true, nil
	})
	n.waitGuestsGone(60*time.Second, guest)

	var second v1alpha1.NodeClaim
	testenv.Eventually(t, 180*time.Second, "a new node claimed, Running, and keeper Running on it", func() (bool, error) {
		cs := n.claims("l1")
		if _, old := cs[first.Spec.NodeName]; old || len(cs) != 1 {
			return false, lazyErr(func() string {
				return fmt.Sprintf("%d claims, the dead one among them: %v\n%s", len(cs), old, n.dump())
			})
		}
		for _, c := range cs {
			second = c
		}
		p := keeperPod(kc)
		return second.Status.Phase == v1alpha1.NodeClaimRunning && p == "Running/"+second.Spec.NodeName,
			fmt.Errorf("claim %s %s, keeper %q", second.Spec.NodeName, second.Status.Phase, p)
	})
	t.Logf("node killed -> keeper Running on a new node in %.2fs", time.Since(t0).Seconds())
	if r := nodesReady(kc); len(r) != 1 || r[second.Spec.NodeName] != "True" {
		t.Errorf("tenant nodes %v, want only %s Ready", r, second.Spec.NodeName)
	}
}

// nodeAdvertisesItsContract: the Node's allocatable CPU and memory are its contract's cpus
// and mem (node.json, as the substrate booted it), not its host's.
func nodeAdvertisesItsContract(t *testing.T, kc, nodeName, nodeJSON string) {
	t.Helper()
	var contract struct {
		CPUs   int `json:"cpus"`
		MemMiB int `json:"memMiB"`
	}
	if err := guestproc.ReadJSON(nodeJSON, &contract); err != nil || contract.CPUs == 0 || contract.MemMiB == 0 {
		t.Errorf("node.json holds no contract figures: %+v %v", contract, err)
		return
	}
	out := tkubectl(t, kc, "", "get", "node", nodeName, "-o", `jsonpath={.status.allocatable.cpu} {.status.allocatable.memory} {.status.capacity.cpu} {.status.capacity.memory}`)
	f := strings.Fields(out)
	if len(f) != 4 {
		t.Errorf("node %s allocatable/capacity: %q", nodeName, out)
		return
	}
	cpu, mem := resource.MustParse(f[0]), resource.MustParse(f[1])
	capCPU, capMem := resource.MustParse(f[2]), resource.MustParse(f[3])
	// A node never advertises more than its host has (a vm node's host is its machine,
	// whose memory is the contract's less what its kernel keeps): then all of it, less the
	// kubelet's eviction threshold (1Mi).
	wantCPU := min(int64(contract.CPUs)*1000, capCPU.MilliValue())
	wantMem := min(int64(contract.MemMiB)<<20, capMem.Value()-1<<20)
	if cpu.MilliValue() != wantCPU || mem.Value() != wantMem {
		t.Errorf("node %s advertises cpu %s memory %s; its contract is %d cpus, %d MiB", nodeName, f[0], f[1], contract.CPUs, contract.MemMiB)
	}
}
