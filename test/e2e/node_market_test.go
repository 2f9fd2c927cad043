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

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
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
