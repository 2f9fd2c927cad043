package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"socialweb.computer/internal/testenv"
)

// nodeService is the pid of the node's process of the socialweb binary whose arguments hold
// word (e.g. "proxy" for kube-proxy), or 0.
func nodeService(state, word string) int {
	for _, pid := range procsWithArg(state) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) == filepath.Base(socialwebBin) && slices.Contains(args, word) {
			return pid
		}
	}
	return 0
}

// A node's network services are started again when they end: kube-proxy and the DNS server
// killed, each is back (a new process) within seconds, the node stays Ready and serves a
// Service by name again. Before, either's end stopped the node and every pod on it.
func TestNode_NetworkServicesComeBack(t *testing.T) {
	t.Parallel()
	const nodeName = "node-r"
	tc := joinableCluster(t, "rst1", nodeName, 10*time.Minute)
	writeProbeImage(t, tc.images)
	n := readyNode(t, tc, "rst1-a", nodeName, nodeOptions{DNSUpstream: "none", Logs: []string{"log", "kube-proxy.log", "node-dns.log"}})
	state, dump := n.State, n.Dump
	kc := tc.kc
	tkubectl(t, kc, servicesObjects, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "pods Running", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
		return out == "client=Running server-0=Running server-1=Running ", fmt.Errorf("%q\n%s", out, dump())
	})
	byName := func() (string, error) {
		out, err := tkubectlErr(kc, "exec", "client", "--", "/svcprobe", "get", "http://probe.default.svc.cluster.local/")
		return strings.TrimSpace(out), err
	}
	testenv.Eventually(t, 60*time.Second, "the Service by name", func() (bool, error) {
		out, err := byName()
		return strings.HasPrefix(out, "200 server-"), fmt.Errorf("%q %v", out, err)
	})

	dir := filepath.Join(state, "rst1-a")
	for _, word := range []string{"proxy", "node-dns"} {
		old := nodeService(dir, word)
		if old == 0 {
			t.Fatalf("no %s process of node %s\n%s", word, nodeName, dump())
		}
		t0 := time.Now()
		// Its process group (in a contained node the process is nsenter's child).
		pgid, err := syscall.Getpgid(old)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, word+" started again", func() (bool, error) {
			pid := nodeService(dir, word)
			return pid != 0 && pid != old, fmt.Errorf("pid %d (was %d)\n%s", pid, old, dump())
		})
		t.Logf("%s killed: a new process in %.1fs", word, time.Since(t0).Seconds())
	}
	testenv.Eventually(t, 60*time.Second, "the Service by name after the restarts", func() (bool, error) {
		out, err := byName()
		return strings.HasPrefix(out, "200 server-"), fmt.Errorf("%q %v\n%s", out, err, dump())
	})
	if out, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); out != "True" {
		t.Fatalf("node %s Ready=%q after its services restarted\n%s", nodeName, out, dump())
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "log")); !strings.Contains(string(log), "kube-proxy started again") {
		t.Errorf("the agent's log does not say kube-proxy started again\n%s", dump())
	}
}

// An in-place resize reaches the container: the node's kubelet keeps a cgroup per pod
// (cgroupsPerQOS under the node's own cgroup), so a resize of the pod's CPU limit is written
// to the container's cgroup and reported in its status, with no restart of the container.
// Without pod cgroups the kubelet dereferenced the missing pod cgroup and panicked, losing
// the node with every pod on it: the kubelet stays the same process.
func TestNode_InPlaceResize(t *testing.T) {
	t.Parallel()
	const nodeName = "node-rz"
	tc := joinableCluster(t, "rz1", nodeName, 10*time.Minute)
	n := readyNode(t, tc, "rz1-a", nodeName, nodeOptions{})
	kc := tc.kc
	tkubectl(t, kc, `apiVersion: v1
kind: Pod
metadata: {name: sized, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: socialweb.computer/busybox:local
    imagePullPolicy: Never
    command: ["/bin/sleep", "3600"]
    resources: {requests: {cpu: 100m, memory: 20Mi}, limits: {cpu: 200m, memory: 40Mi}}
`, "apply", "-f", "-")
	testenv.Eventually(t, 60*time.Second, "the pod Running", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "sized", "-o", "jsonpath={.status.phase}")
		return out == "Running", fmt.Errorf("%q\n%s", out, n.Dump())
	})
	dir := filepath.Join(n.State, "rz1-a")
	kubelet := nodeService(dir, "kubelet")
	quota := func() string {
		out, _ := tkubectlErr(kc, "exec", "sized", "--", "/bin/sh", "-c", "cat /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null | head -1; cat /sys/fs/cgroup/cpu.max 2>/dev/null")
		return strings.TrimSpace(out)
	}
	if q := quota(); !strings.HasPrefix(q, "20000") {
		t.Errorf("the container's CPU quota before the resize is %q, want 20000 (200m)\n%s", q, n.Dump())
	}
	out, err := tkubectlErr(kc, "patch", "pod", "sized", "--subresource", "resize", "--type=merge", "-p",
		`{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"150m","memory":"20Mi"},"limits":{"cpu":"300m","memory":"40Mi"}}}]}}`)
	if err != nil {
		t.Fatalf("resize: %q %v", out, err)
	}
	testenv.Eventually(t, 60*time.Second, "the resize applied to the container", func() (bool, error) {
		got, _ := tkubectlErr(kc, "get", "pod", "sized", "-o", "jsonpath={.status.containerStatuses[0].resources.limits.cpu}")
		q := quota()
		return got == "300m" && strings.HasPrefix(q, "30000"), fmt.Errorf("status limit %q, quota %q", got, q)
	})
	if now := nodeService(dir, "kubelet"); kubelet == 0 || now != kubelet {
		t.Fatalf("the kubelet was %d, is %d\n%s", kubelet, now, n.Dump())
	}
	if out, _ := tkubectlErr(kc, "get", "pod", "sized", "-o", "jsonpath={.status.phase} {.status.containerStatuses[0].restartCount}"); out != "Running 0" {
		t.Fatalf("the pod is %q after the resize, want Running with no restart\n%s", out, n.Dump())
	}
}
