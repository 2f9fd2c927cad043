package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// burnerPod asks for more CPU than its node's contract (a limit of 1250m, as every Downward
// API conformance spec does) and burns three CPUs' worth.
const burnerPod = `apiVersion: v1
kind: Pod
metadata: {name: burner, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "for i in 1 2 3; do (while :; do :; done) & done; sleep 3600"]
    resources:
      requests: {cpu: 250m}
      limits: {cpu: 1250m}
`

// A node of a 1-CPU contract runs a pod whose CPU limit is above it, as a 1-CPU machine
// does, and the node as a whole still uses at most one CPU while the pod burns three.
// Serial: it burns a core, and it measures what the node gets of the machine.
func TestNode_CPULimitAboveTheContract(t *testing.T) {
	const nodeName = "node-cpu"
	tc := joinableCluster(t, "cpu1", nodeName, 10*time.Minute)
	state := filepath.Join(t.TempDir(), "nodes")
	s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, ImageDir: tc.images, EgressDeny: testEgressDeny, EgressAllow: testEgressAllow})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)
	join, _ := json.Marshal(node.Join{Server: tc.bundle.Server, NodeName: nodeName})
	if _, err := s.Boot(context.Background(), substrate.GuestSpec{
		ID: "cpu1-a", UserData: join, CPUs: 1, MemMiB: 512,
		Secrets: map[string][]byte{node.SecretKubeconfig: tc.bundle.Kubeconfig, node.SecretCA: tc.bundle.CAPEM},
	}); err != nil {
		t.Fatal(err)
	}
	dump := func() string {
		var b strings.Builder
		for _, f := range []string{"log", "kubelet.log"} {
			out, _ := guestproc.Tail(filepath.Join(state, "cpu1-a", f), 20)
			fmt.Fprintf(&b, "--- %s\n%s\n", f, out)
		}
		return b.String()
	}
	testenv.Eventually(t, 120*time.Second, "node Ready", func() (bool, error) {
		out, _ := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return out == "True", fmt.Errorf("%q\n%s", out, dump())
	})
	// The node advertises its contract, whatever bounds it.
	if out, _ := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", "jsonpath={.status.allocatable.cpu}"); out != "1" {
		t.Errorf("allocatable cpu %q, want 1", out)
	}

	tkubectl(t, tc.kc, burnerPod, "apply", "-f", "-")
	testenv.Eventually(t, 120*time.Second, "the burner Running", func() (bool, error) {
		out, _ := tkubectlErr(tc.kc, "get", "pod", "burner", "-o",
			`jsonpath={.status.phase}/{.status.containerStatuses[0].state.waiting.reason}{.status.containerStatuses[0].lastState.terminated.reason}{.status.containerStatuses[0].state.terminated.reason}`)
		if strings.Contains(out, "StartError") || strings.Contains(out, "RunContainerError") || strings.HasPrefix(out, "Failed") {
			msg, _ := tkubectlErr(tc.kc, "get", "pod", "burner", "-o", `jsonpath={.status.containerStatuses[0]}`)
			t.Fatalf("the burner did not start: %s\n%s", out, msg)
		}
		return out == "Running/", fmt.Errorf("%q\n%s", out, dump())
	})

	// The node's whole cgroup (agent, containerd, kubelet and the pod) over a few seconds.
	var dirs []string
	if err := guestproc.ReadJSON(filepath.Join(state, "cpu1-a", "cgroups.json"), &dirs); err != nil {
		t.Fatal(err)
	}
	var acct string
	for _, d := range dirs {
		if strings.HasPrefix(d, "/sys/fs/cgroup/cpuacct/") || strings.HasPrefix(d, "/sys/fs/cgroup/cpu,cpuacct/") {
			acct = filepath.Join(d, "cpuacct.usage")
		}
	}
	if acct == "" {
		t.Fatalf("the node has no cpuacct cgroup: %v", dirs)
	}
	usage := func() time.Duration {
		b, err := os.ReadFile(acct)
		if err != nil {
			t.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ns)
	}
	time.Sleep(2 * time.Second) // the burners' loops started
	u0, t0 := usage(), time.Now()
	time.Sleep(6 * time.Second)
	cpus := float64(usage()-u0) / float64(time.Since(t0))
	t.Logf("the node used %.2f CPUs while its pod burned three", cpus)
	// A node held to one CPU cannot read above 1 but for the moments the reads are apart;
	// the host has 2 CPUs, so an unbound node reads above it even on a busy host.
	if cpus > 1.05 {
		t.Errorf("the node used %.2f CPUs, its contract is 1", cpus)
	}
	// The burner burns: a bound that is never reached proves nothing. The host is shared
	// with other work (another node may share the CPU, at equal shares), hence the low
	// floor: 0.36 to 0.99 measured.
	if cpus < 0.2 {
		t.Errorf("the node used only %.2f CPUs: the pod is not burning (the bound is untested)", cpus)
	}
}
