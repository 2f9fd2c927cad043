package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// hostStateOf lists what the node of tag holds on the host: its network namespace, veth,
// run dir, egress chain and cgroups (by the names node.go gives them).
func hostStateOf(tag string) []string {
	var left []string
	if _, err := os.Stat("/run/netns/swnode-" + tag); err == nil {
		left = append(left, "netns swnode-"+tag)
	}
	if out, _ := exec.Command("ip", "link", "show", "swn"+tag).Output(); len(out) != 0 {
		left = append(left, "veth swn"+tag)
	}
	if _, err := os.Stat("/run/swnode/" + tag); err == nil {
		left = append(left, "run dir /run/swnode/"+tag)
	}
	if exec.Command("iptables", "-w", "-n", "-L", "SWN-"+tag).Run() == nil {
		left = append(left, "iptables chain SWN-"+tag)
	}
	if out, _ := exec.Command("iptables", "-w", "-S", "INPUT").Output(); strings.Contains(string(out), "swn"+tag+" ") {
		left = append(left, "INPUT rules of swn"+tag)
	}
	out, _ := exec.Command("find", "/sys/fs/cgroup", "-maxdepth", "6", "-type", "d", "-name", "socialweb-node-"+tag).Output()
	for _, d := range strings.Fields(string(out)) {
		left = append(left, "cgroup "+d)
	}
	return left
}

// releaseUpNodes gives up the nodes up's node bidder in dir left running (a node outlives
// up by design) with `socialweb node sweep --release`, and checks that none of the data
// dir's nodes left host state behind. startUp runs it once up is stopped.
func releaseUpNodes(t *testing.T, dir string) {
	t.Helper()
	guests, _ := filepath.Glob(filepath.Join(app.LocalNodeStateDir(dir), "g*")) // bidder.GuestID
	if len(guests) == 0 {
		return
	}
	if out, code := runCLI(t, "node", "sweep", "--data-dir", dir, "--release"); code != 0 {
		t.Errorf("socialweb node sweep --release: exit %d\n%s", code, out)
	}
	for _, g := range guests {
		if left := hostStateOf(nodeTag(g)); len(left) != 0 {
			t.Errorf("node guest %s left on the host: %s", g, strings.Join(left, ", "))
		}
	}
}

// A node whose up crashed and took the node with it (up and every process of the node
// SIGKILLed, as in a host's power loss without the reboot) leaves its network namespace,
// veth, run dir, iptables chain and cgroups; up started again on the same data dir sweeps
// them before its bidder adopts its guests, a live node of another data dir on the same
// host keeps all of its own.
func TestNode_DeadNodesSweptAtRestart(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	kc := n.cluster("c1", "maxNodes: 1, scaleHold: 3s")
	tkubectl(t, kc, keeperDeployment, "apply", "-f", "-")
	var claim v1alpha1.NodeClaim
	for _, c := range n.waitClaimsRunning("c1", 1, 120*time.Second) {
		claim = c
	}
	guest := n.guestOf(claim.Spec.NodeName)
	tag := n.tags[guest]
	testenv.Eventually(t, 60*time.Second, "the rented node's host state made", func() (bool, error) {
		left := hostStateOf(tag)
		return len(left) >= 6, fmt.Errorf("%v", left)
	})

	// Another data dir's node on this host, joined to the same cluster, running throughout.
	var cl v1alpha1.Cluster
	if err := n.c.Get(n.ctx, client.ObjectKey{Namespace: "default", Name: "c1"}, &cl); err != nil {
		t.Fatal(err)
	}
	otherState := app.LocalNodeStateDir(filepath.Join(t.TempDir(), "other"))
	other, err := node.New(node.Config{StateDir: otherState, Binary: socialwebBin, DNSUpstream: "none", EgressDeny: testEgressDeny, EgressAllow: testEgressAllow})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, other, otherState)
	bundle, err := tenant.MintNodeBundle(filepath.Join(n.dir, "tenants"), tenant.Key{Namespace: "default", Name: "c1"}, "other-1", cl.Status.Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bootNode(t, other, "o1", "other-1", bundle)
	otherTag := nodeTag(filepath.Join(otherState, "o1"))
	var otherLeft []string
	testenv.Eventually(t, 60*time.Second, "the other data dir's node's host state made", func() (bool, error) {
		otherLeft = hostStateOf(otherTag)
		return len(otherLeft) >= 6, fmt.Errorf("%v", otherLeft)
	})

	// The crash: up, then every process of its node.
	var rec guestproc.Record
	if err := guestproc.ReadJSON(filepath.Join(guest, guestproc.PidFile), &rec); err != nil || rec.PID <= 0 {
		t.Fatalf("the node guest's pid.json: %+v %v", rec, err)
	}
	_ = n.up.cmd.Process.Signal(syscall.SIGKILL)
	<-n.up.done
	_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	testenv.Eventually(t, 30*time.Second, "no process of the crashed node left", func() (bool, error) {
		pids := n.guestProcs(guest)
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		return len(pids) == 0, fmt.Errorf("left: %v", pids)
	})
	if left := hostStateOf(tag); len(left) < 6 {
		t.Fatalf("the crash left only %v of the node's host state: nothing to sweep", left)
	}

	n.up = startUp(t, n.dir)
	id := filepath.Base(guest)
	t.Logf("%s", n.up.line(t, "swept node "+id))
	if left := hostStateOf(tag); len(left) != 0 {
		t.Errorf("the dead node's host state left after the restart: %s", strings.Join(left, ", "))
	}
	// Its agent may have made more since (a cgroup of one more hierarchy): none of what it
	// had may be gone.
	now := hostStateOf(otherTag)
	for _, h := range otherLeft {
		if !slices.Contains(now, h) {
			t.Errorf("the other data dir's node lost its %s (now %v)", h, now)
		}
	}
	if st, err := other.Status(context.Background(), "o1"); err != nil || st.Phase != substrate.Running {
		t.Errorf("the other data dir's node: %s %v, want Running", st.Phase, err)
	}
}
