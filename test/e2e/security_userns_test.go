package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// TestSecurity_TenantPodsRunInUserNamespaces: on up's defaults (its nodes run the node
// runtime, so --pod-user-namespaces auto is required), a plain pod the owner applies, with no
// word about user namespaces, runs as uid 0 in a user namespace of its own, an unprivileged
// uid on the host; a pod asking for the host's uids is refused.
func TestSecurity_TenantPodsRunInUserNamespaces(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	// The test image is staged before the data dir's first start.
	if err := os.MkdirAll(filepath.Join(dir, "node-bidder", "images"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := node.WriteBusyboxImage(filepath.Join(dir, "node-bidder", "images", "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	up := startUp(t, dir)
	up.phase(t, "user namespaces required")
	if l := up.line(t, "local bidder "+app.LocalNodeBidderHandle); !strings.Contains(l, "pod-user-namespaces") {
		t.Fatalf("the node bidder on the node runtime: %q; want its layers to name pod-user-namespaces", l)
	}
	c := coreClient(t, dir)
	key := client.ObjectKey{Namespace: "default", Name: "us1"}
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: us1, namespace: default}
spec: {account: "`+tenantOwner+`", name: us1, running: true, maxNodes: 1, scaleHold: 5s}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, key, v1alpha1.ClusterReady, 90*time.Second)
	if cl.Status.PodUserNamespaces != "required" {
		t.Errorf("status.podUserNamespaces %q, want required (up's default on nodes of the node runtime)", cl.Status.PodUserNamespaces)
	}
	kc := mint(t, dir, cl)

	if _, stderr, err := kubectlTry(kc, usernsPod("hostusers", true, 1), "apply", "-f", "-"); err == nil || !strings.Contains(stderr, "user namespace of its own") {
		t.Errorf("a pod with hostUsers: true: %v %q; want refused naming the user namespace", err, stderr)
	}

	marker := 7_000_000 + rand.IntN(1_000_000)
	plain := fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: default}
spec:
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo uid_map $(cat /proc/self/uid_map); echo id $(id -u); exec sleep %d"]
`, node.BusyboxImage, marker)
	tkubectl(t, kc, plain, "apply", "-f", "-")
	if got := tkubectl(t, kc, "", "get", "pod", "plain", "-o", "jsonpath={.spec.hostUsers}"); got != "false" {
		t.Errorf("the plain pod's spec.hostUsers is %q, want false (defaulted by the floor)", got)
	}
	uid := -1
	testenv.Eventually(t, 180*time.Second, "the plain pod's process on the host", func() (bool, error) {
		uid = hostUIDOf(marker)
		phase, _ := tkubectlErr(kc, "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {.status.containerStatuses[0].state}{\"\\n\"}{end}")
		return uid >= 0, fmt.Errorf("pods: %s", phase)
	})
	logs, _ := tkubectlErr(kc, "logs", "plain")
	t.Logf("a plain pod: host uid %d; in the pod: %s", uid, strings.Join(strings.Fields(logs), " "))
	if uid == 0 {
		t.Fatalf("a plain tenant pod's uid 0 is host root")
	}
	if !strings.Contains(logs, "id 0") || strings.Contains(logs, "uid_map 0 0 4294967295") {
		t.Fatalf("the plain pod is not uid 0 in a user namespace of its own: %q", logs)
	}
	if f := strings.Fields(strings.TrimPrefix(strings.SplitN(logs, "\n", 2)[0], "uid_map")); len(f) != 3 || f[1] != strconv.Itoa(uid) {
		t.Fatalf("uid_map %v does not map uid 0 to the host uid %d", f, uid)
	}

	// The node was rented under a contract that required the layer, from a bidder stating it.
	var ccs v1alpha1.ComputeContractList
	if err := c.List(context.Background(), &ccs); err != nil {
		t.Fatal(err)
	}
	nodeContracts := 0
	for _, cc := range ccs.Items {
		if cc.Spec.ComputeKind != v1alpha1.ComputeKindNode {
			continue
		}
		nodeContracts++
		if !slices.Equal(cc.Spec.RequireLayers, []string{"pod-user-namespaces"}) {
			t.Errorf("node contract %s/%s requires layers %v, want [pod-user-namespaces]", cc.Namespace, cc.Name, cc.Spec.RequireLayers)
		}
	}
	if nodeContracts == 0 {
		t.Error("no node contract")
	}

	// Deleting the cluster releases its node before up stops.
	if err := c.Delete(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "the Cluster is gone", func() (bool, error) {
		err := c.Get(context.Background(), key, &v1alpha1.Cluster{})
		return client.IgnoreNotFound(err) == nil && err != nil, err
	})
}

// TestSecurity_UsernsClusterRentsOnlyCapableNodes: a cluster that runs every
// pod in a user namespace declares node contracts requiring the pod-user-namespaces layer; a
// node bidder whose nodes run the host's older containerd and runc (no user namespaces)
// does not state it, so it is not waited for, its bid is refused, and no node joins: the
// pods would all fail there.
func TestSecurity_UsernsClusterRentsOnlyCapableNodes(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir, "--pod-user-namespaces", "required", "--node-runtime", node.HostRuntime, "--node-bid-window", "1s")
	up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	if l := up.line(t, "local bidder "+app.LocalNodeBidderHandle); !strings.Contains(l, "seccomp") || strings.Contains(l, "pod-user-namespaces") {
		t.Fatalf("the node bidder on the host's runtime: %q; want its layers without pod-user-namespaces", l)
	}
	c := coreClient(t, dir)
	key := client.ObjectKey{Namespace: "default", Name: "us2"}
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: us2, namespace: default}
spec: {account: "`+tenantOwner+`", name: us2, running: true, maxNodes: 1}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, key, v1alpha1.ClusterReady, 90*time.Second)
	kc := mint(t, dir, cl)
	tkubectl(t, kc, `apiVersion: v1
kind: Pod
metadata: {name: waits, namespace: default}
spec:
  containers: [{name: c, image: socialweb.computer/pause:local, imagePullPolicy: Never}]
`, "apply", "-f", "-")
	var failed v1alpha1.ComputeContract
	testenv.Eventually(t, 120*time.Second, "the node contract fails for want of the layer", func() (bool, error) {
		var ccs v1alpha1.ComputeContractList
		if err := c.List(context.Background(), &ccs); err != nil {
			return false, err
		}
		var seen []string
		for _, cc := range ccs.Items {
			if cc.Spec.ComputeKind != v1alpha1.ComputeKindNode {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s %v: %s", cc.Name, cc.Status.Phase, cc.Spec.RequireLayers, cc.Status.Message))
			if cc.Status.Phase == v1alpha1.ComputeContractFailed {
				failed = cc
				return true, nil
			}
		}
		return false, fmt.Errorf("node contracts: %v", seen)
	})
	if !strings.Contains(failed.Status.Message, "requireLayers pod-user-namespaces") {
		t.Errorf("the failed node contract's message does not name the layer: %q", failed.Status.Message)
	}
	if n := tkubectl(t, kc, "", "get", "nodes", "-o", "name"); strings.TrimSpace(n) != "" {
		t.Errorf("a node joined: %s", n)
	}
	if err := c.Delete(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "the Cluster is gone", func() (bool, error) {
		err := c.Get(context.Background(), key, &v1alpha1.Cluster{})
		return client.IgnoreNotFound(err) == nil && err != nil, err
	})
}
