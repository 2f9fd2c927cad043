package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// The Metrics API of a tenant cluster: at zero nodes `kubectl top nodes` answers with no
// figures (the API is there); with a node running a busy pod, `kubectl top nodes` and
// `kubectl top pods` print CPU and memory figures for them.
func TestMetrics_KubectlTop(t *testing.T) {
	t.Parallel()
	const nodeName = "node-m"
	tc := joinableCluster(t, "met", nodeName, 10*time.Minute)
	kc := tc.kc

	if out := tkubectl(t, kc, "", "get", "--raw", "/apis/metrics.k8s.io/v1beta1/nodes"); !strings.Contains(out, `"kind":"NodeMetricsList"`) {
		t.Fatalf("metrics.k8s.io at zero nodes: %s", out)
	}
	if out := tkubectl(t, kc, "", "api-resources", "--api-group=metrics.k8s.io", "-o", "name"); !strings.Contains(out, "nodes.metrics.k8s.io") || !strings.Contains(out, "pods.metrics.k8s.io") {
		t.Fatalf("discovery of metrics.k8s.io: %q", out)
	}

	dump := readyNode(t, tc, "met-a", nodeName, nodeOptions{Logs: []string{"kubelet.log"}, Lines: 20}).Dump
	tkubectl(t, kc, `apiVersion: v1
kind: Pod
metadata: {name: busy, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: `+nodeName+`}
  containers:
  - name: spin
    image: `+node.BusyboxImage+`
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "while :; do :; done"]
    resources: {limits: {cpu: 200m, memory: 32Mi}}
`, "apply", "-f", "-")
	testenv.Eventually(t, 90*time.Second, "pod busy Running", func() (bool, error) {
		out, _ := tkubectlErr(kc, "get", "pod", "busy", "-o", "jsonpath={.status.phase}")
		return out == "Running", fmt.Errorf("%q\n%s", out, dump())
	})
	t0 := time.Now()
	testenv.Eventually(t, 60*time.Second, "kubectl top nodes prints the node's figures", func() (bool, error) {
		out, err := tkubectlErr(kc, "top", "node", nodeName, "--no-headers")
		f := strings.Fields(out)
		return err == nil && len(f) == 5 && f[0] == nodeName && strings.HasSuffix(f[1], "m") && strings.HasSuffix(f[3], "Mi"),
			fmt.Errorf("%q %v", out, err)
	})
	testenv.Eventually(t, 60*time.Second, "kubectl top pods prints the pod's figures", func() (bool, error) {
		out, err := tkubectlErr(kc, "top", "pod", "busy", "--no-headers")
		f := strings.Fields(out)
		return err == nil && len(f) == 3 && f[0] == "busy" && strings.HasSuffix(f[1], "m") && f[1] != "0m" && strings.HasSuffix(f[2], "Mi"),
			fmt.Errorf("%q %v", out, err)
	})
	t.Logf("pod Running -> kubectl top answers in %.1fs", time.Since(t0).Seconds())
	out := tkubectl(t, kc, "", "top", "pods", "--containers")
	t.Logf("kubectl top pods --containers:\n%s", out)
	if !strings.Contains(out, "spin") {
		t.Errorf("per-container figures: %q", out)
	}
}
