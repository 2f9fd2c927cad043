package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

const crasherPod = `apiVersion: v1
kind: Pod
metadata: {name: crasher, namespace: default}
spec:
  automountServiceAccountToken: false
  restartPolicy: Always
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo run of $(cat /proc/uptime); sleep 1; exit 3"]
`

// A container that restarts keeps its previous run's logs: `kubectl logs --previous` reads
// the run before the current one (the kubelet keeps one dead container per container).
func TestNode_LogsOfThePreviousContainer(t *testing.T) {
	t.Parallel()
	const nodeName = "node-logs"
	tc := joinableCluster(t, "lg1", nodeName, 10*time.Minute)
	dump := readyNode(t, tc, "lg1-a", nodeName, nodeOptions{Logs: []string{"kubelet.log"}, Lines: 30}).Dump
	tkubectl(t, tc.kc, crasherPod, "apply", "-f", "-")
	testenv.Eventually(t, 120*time.Second, "the container restarted twice", func() (bool, error) {
		out, _ := tkubectlErr(tc.kc, "get", "pod", "crasher", "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
		n, _ := strconv.Atoi(out)
		return n >= 2, fmt.Errorf("restartCount %q\n%s", out, dump())
	})
	out, err := tkubectlErr(tc.kc, "logs", "--previous", "crasher")
	if err != nil || !strings.Contains(out, "run of ") {
		t.Fatalf("kubectl logs --previous: %v %q\n%s", err, out, dump())
	}
	t.Logf("previous run: %s", strings.TrimSpace(out))
}
