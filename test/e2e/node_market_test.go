package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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
	requireTenantHost(t)
	if err := node.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	// Registered before up: runs after up stopped, and stops any node a failure left.
	state := filepath.Join(dir, "node-bidder", "guests")
	t.Cleanup(func() {
		s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin})
		if err != nil {
			t.Error(err)
			return
		}
		substratetest.Cleanup(t, s, state)
	})

	up := startUp(t, dir)
	bidderDID := up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	// up made the node bidder's image dir; every node imports what it holds at boot.
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	c := coreClient(t, dir)
	ctx := context.Background()

	ckey := client.ObjectKey{Namespace: "default", Name: "m1"}
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: m1, namespace: default}
spec: {account: "`+tenantOwner+`", name: m1, running: true}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, ckey, v1alpha1.ClusterReady, 60*time.Second)
	kc := mint(t, dir, cl)

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
	sec := &v1alpha1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "m1-join"}, Type: "socialweb.computer/node-join", Data: b.Data()}
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
	if cc.Status.Winner != bidderDID {
		t.Errorf("winner %s, want the node bidder %s", cc.Status.Winner, bidderDID)
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

	// The guests of this bidder: their run dirs and network namespaces are named by tag.
	ids, err := filepath.Glob(filepath.Join(state, "g*")) // bidder.GuestID; .images is the sandbox image
	if err != nil || len(ids) != 1 {
		t.Fatalf("node guests in %s: %v %v", state, ids, err)
	}
	h := sha256.Sum256([]byte(ids[0]))
	tag := hex.EncodeToString(h[:])[:10]

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
	testenv.Eventually(t, 30*time.Second, "the node's processes gone", func() (bool, error) {
		pids := procsWithArg(state, "/run/swnode/"+tag)
		return len(pids) == 0, fmt.Errorf("left: %v", pids)
	})
	if _, err := os.Stat("/run/swnode/" + tag); !os.IsNotExist(err) {
		t.Errorf("run dir /run/swnode/%s left: %v", tag, err)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", "swnode-"+tag)); !os.IsNotExist(err) {
		t.Errorf("network namespace swnode-%s left: %v", tag, err)
	}
	if out, _ := exec.Command("ip", "link", "show", "swn"+tag).Output(); len(out) != 0 {
		t.Errorf("veth swn%s left: %s", tag, out)
	}
	if m := mountsUnder(state); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
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
	c     client.Client
	ctx   context.Context
	tags  map[string]string // guest dir -> tag
}

// startNodeUp starts up with its node bidder and the busybox image in the bidder's image
// dir; a cleanup registered before up stops any node a failure left.
func startNodeUp(t *testing.T, args ...string) *nodeUp {
	t.Helper()
	requireTenantHost(t)
	if err := node.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
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
	n.up = startUp(t, dir, args...)
	n.up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
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
spec: {account: "`+tenantOwner+`", name: `+name+`, running: true, `+spec+`}
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
		return len(cs) == want && running == want, fmt.Errorf("%d claims, %d Running\n%s", len(cs), running, n.dump())
	})
	n.guests()
	return cs
}

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
// and checks they left no run dir, network namespace or mount.
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
		if _, err := os.Stat("/run/swnode/" + tag); !os.IsNotExist(err) {
			t.Errorf("run dir /run/swnode/%s left: %v", tag, err)
		}
		if _, err := os.Stat(filepath.Join("/run/netns", "swnode-"+tag)); !os.IsNotExist(err) {
			t.Errorf("network namespace swnode-%s left: %v", tag, err)
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
	n := startNodeUp(t)
	kc := n.cluster("s1", "maxNodes: 1, scaleHold: 3s")

	t0 := time.Now()
	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("s1", 1, 120*time.Second) {
		claim = c
	}
	t.Logf("pod -> claim Running in %.2fs", time.Since(t0).Seconds())
	waitPod(t, kc, "hello", "Succeeded", claim.Spec.NodeName, 90*time.Second)
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

	tkubectl(t, kc, "", "delete", "pod", "hello")
	t1 := time.Now()
	testenv.Eventually(t, 90*time.Second, "the claim gone", func() (bool, error) {
		cs := n.claims("s1")
		return len(cs) == 0, fmt.Errorf("%d claims\n%s", len(cs), n.dump())
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
