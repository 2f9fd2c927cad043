package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
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

// ACC31: a tenant cluster Ready at zero nodes scales up by one for a pending pod and back
// down once the pod is gone, with every part real: the node host claims a node, the NodeClaim
// controller mints the join bundle and composes the cluster's Infra entry, the Infra
// controller makes the node contract (its requester up's node-requester repo), up's node
// bidder wins it and boots a node guest that joins; the claim is Running and the pod runs to
// Succeeded on the node. Deleted, the pod leaves the node empty: after scaleHold the claim
// goes, the contract is released, and the node leaves no process or network namespace.
func TestACC31_ScaleUpOne(t *testing.T) {
	requireTenantHost(t)
	if err := node.Prerequisites(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	dir := filepath.Join(t.TempDir(), "data")
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
	up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	c := coreClient(t, dir)
	ctx := context.Background()

	ckey := client.ObjectKey{Namespace: "default", Name: "s1"}
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: s1, namespace: default}
spec: {account: "`+tenantOwner+`", name: s1, running: true, maxNodes: 1, scaleHold: 3s}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, ckey, v1alpha1.ClusterReady, 60*time.Second)
	kc := mint(t, dir, cl)
	if out, _ := tkubectlErr(kc, "get", "nodes", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Fatalf("nodes before any pod: %q", out)
	}

	claims := func() []v1alpha1.NodeClaim {
		var l v1alpha1.NodeClaimList
		if err := c.List(ctx, &l, client.InNamespace("default")); err != nil {
			t.Fatal(err)
		}
		var out []v1alpha1.NodeClaim
		for _, nc := range l.Items {
			if nc.Spec.ClusterRef.Name == "s1" {
				out = append(out, nc)
			}
		}
		return out
	}
	dump := func() string {
		var s strings.Builder
		if b, err := os.ReadFile(filepath.Join(dir, "logs", "socialweb.log")); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.Contains(l, "nodeclaim") || strings.Contains(l, "nodehost") || strings.Contains(l, app.LocalNodeBidderHandle) || strings.Contains(l, "computecontract_phase") {
					fmt.Fprintln(&s, l)
				}
			}
		}
		return s.String()
	}

	t0 := time.Now()
	tkubectl(t, kc, nodePod, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	testenv.Eventually(t, 120*time.Second, "one NodeClaim Running", func() (bool, error) {
		cs := claims()
		if len(cs) > 1 {
			t.Fatalf("%d claims for one pod", len(cs))
		}
		if len(cs) == 0 {
			return false, fmt.Errorf("no claim\n%s", dump())
		}
		claim = cs[0]
		if claim.Status.Phase == v1alpha1.NodeClaimFailed || claim.Status.Phase == v1alpha1.NodeClaimLost {
			t.Fatalf("claim %s: %s\n%s", claim.Status.Phase, claim.Status.Message, dump())
		}
		return claim.Status.Phase == v1alpha1.NodeClaimRunning, fmt.Errorf("%s %q\n%s", claim.Status.Phase, claim.Status.Message, dump())
	})
	t.Logf("pod -> claim Running in %.2fs", time.Since(t0).Seconds())
	nodeName := claim.Spec.NodeName
	testenv.Eventually(t, 90*time.Second, "pod Succeeded on the claimed node", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "hello", "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
		if strings.HasPrefix(out, "Failed") {
			t.Fatalf("pod failed: %s", tkubectl(t, kc, "", "get", "pod", "hello", "-o", "yaml"))
		}
		return out == "Succeeded/"+nodeName, fmt.Errorf("%q", out)
	})
	t.Logf("pod -> Succeeded in %.2fs", time.Since(t0).Seconds())
	if claim.Status.Infra == nil || claim.Status.Infra.ComputeContract == "" {
		t.Fatalf("claim status.infra: %+v", claim.Status.Infra)
	}
	ccKey := client.ObjectKey{Namespace: claim.Status.Infra.Workspace, Name: claim.Status.Infra.ComputeContract}
	var cc v1alpha1.ComputeContract
	if err := c.Get(ctx, ccKey, &cc); err != nil {
		t.Fatal(err)
	}
	if cc.Spec.ComputeKind != v1alpha1.ComputeKindNode || cc.Spec.RepoRef == nil || cc.Spec.RepoRef.Name != infra.NodeRequesterRepo {
		t.Errorf("contract spec: %+v", cc.Spec)
	}
	ids, err := filepath.Glob(filepath.Join(state, "g*"))
	if err != nil || len(ids) != 1 {
		t.Fatalf("node guests in %s: %v %v", state, ids, err)
	}
	h := sha256.Sum256([]byte(ids[0]))
	tag := hex.EncodeToString(h[:])[:10]

	tkubectl(t, kc, "", "delete", "pod", "hello")
	t1 := time.Now()
	testenv.Eventually(t, 90*time.Second, "the claim gone", func() (bool, error) {
		cs := claims()
		return len(cs) == 0, fmt.Errorf("%d claims\n%s", len(cs), dump())
	})
	t.Logf("pod deleted -> claim gone in %.2fs", time.Since(t1).Seconds())
	testenv.Eventually(t, 60*time.Second, "the contract released", func() (bool, error) {
		err := c.Get(ctx, ccKey, &cc)
		if apierrors.IsNotFound(err) {
			return true, nil // released, then deleted by the Infra controller
		}
		return err == nil && cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("%s %v", cc.Status.Phase, err)
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
	if m := mountsUnder(state); len(m) != 0 {
		t.Errorf("mounts left: %v", m)
	}
}
