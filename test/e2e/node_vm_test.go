package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
)

// A tenant cluster gains a node of the vm flavour: containerd and the kubelet inside a qemu
// microVM booted from the shared root disk, on a tap device in the node's namespace. The
// node registers with the guest's address as its InternalIP and goes Ready, a pod of an
// image carried on its state disk runs to Succeeded, the apiserver reaches the kubelet in
// the guest for the pod's log, and Stop leaves no process, namespace or disk.
func TestNode_VMFlavour_JoinsTenantClusterAndRunsAPod(t *testing.T) {
	img := vmImage(t)
	const nodeName = "vm-node-a"
	tc := joinableCluster(t, "v1", nodeName, time.Hour)
	state := filepath.Join(t.TempDir(), "nodes")
	cfg := node.Config{StateDir: state, Binary: socialwebBin, ImageDir: tc.images, EgressDeny: testEgressDeny, EgressAllow: testEgressAllow,
		Flavour: node.FlavourVM, VMImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")}
	s, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)
	kc := tc.kc

	ctx := context.Background()
	t0 := time.Now()
	st := bootNode(t, s, "v1-a", nodeName, tc.bundle)
	t.Logf("booted in %.2fs: %s at %s, accelerator %s", time.Since(t0).Seconds(), st.Phase, st.Address, st.Accelerator)
	if !strings.HasPrefix(st.Address, "10.79.") {
		t.Errorf("a vm node's address is %q, want its guest's in 10.79.0.0/16", st.Address)
	}
	dump := func() string {
		out, _ := s.Logs(ctx, "v1-a", 40)
		agent, _ := os.ReadFile(filepath.Join(state, "v1-a", "log"))
		return fmt.Sprintf("--- host agent\n%s--- console\n%s", agent, out)
	}

	// Under TCG a node takes tens of seconds to Ready.
	nodeRunsHello(t, nodeJoined{kc: kc, s: s, id: "v1-a", name: nodeName, address: st.Address, booted: t0, dump: dump}, 5*time.Minute)
	// The node's kubelet and containerd are in the guest: the host runs qemu for it, not them.
	if pids := procsWithArg("--hostname-override\x00" + nodeName); len(pids) != 0 {
		t.Errorf("a kubelet of the vm node runs on the host: %v", pids)
	}

	// A new value over the same state dir (a restarted bidder) finds the machine and stops it.
	s2, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if gs, err := s2.List(ctx); err != nil || len(gs) != 1 || gs[0].Phase != substrate.Running || gs[0].Address != st.Address || gs[0].Accelerator != st.Accelerator {
		t.Fatalf("restarted substrate lists %+v %v", gs, err)
	}
	if out, _ := s2.Logs(ctx, "v1-a", 0); !strings.Contains(string(out), "socialweb-node: disks mounted") {
		t.Errorf("a vm node's logs are not its console:\n%s", out)
	}
	t2 := time.Now()
	if err := s2.Stop(ctx, "v1-a"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop in %.2fs", time.Since(t2).Seconds())
	if g, _ := s.Status(ctx, "v1-a"); g.Phase != substrate.Stopped {
		t.Errorf("after Stop: %+v", g)
	}
	if pids := substratetest.Procs(state); len(pids) != 0 {
		t.Errorf("processes of the node left (qemu): %v", pids)
	}
	// This node's namespace: other runs on a shared host have nodes of their own.
	if _, err := os.Stat("/run/netns/swnode-" + nodeTag(filepath.Join(state, "v1-a"))); !os.IsNotExist(err) {
		t.Errorf("network namespace of the node left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "v1-a", "work")); !os.IsNotExist(err) {
		t.Errorf("work dir (the state disk) left: %v", err)
	}
	if err := s.Remove(ctx, "v1-a"); err != nil {
		t.Error(err)
	}
}
