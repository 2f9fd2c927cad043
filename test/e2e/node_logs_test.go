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
    command: ["/bin/sh", "-c", "echo run of $(cat /proc/uptime); sleep 15; exit 3"]
`

// A container that restarts keeps its previous run's logs: `kubectl logs --previous` reads
// the run before the current one (the kubelet keeps one dead container per container).
//
// The logs are asked for while a later run is running, so the last state names the newest
// dead container, the one the kubelet keeps: once the current run ends too, the kubelet's
// container GC (every minute) may remove the older dead one before the pod's status names
// the newer as its last state, and "previous" would name a container gone (upstream behaves
// the same).
func TestNode_LogsOfThePreviousContainer(t *testing.T) {
	t.Parallel()
	const nodeName = "node-logs"
	tc := joinableCluster(t, "lg1", nodeName, 10*time.Minute)
	dump := readyNode(t, tc, "lg1-a", nodeName, nodeOptions{Logs: []string{"kubelet.log"}, Lines: 30}).Dump
	tkubectl(t, tc.kc, crasherPod, "apply", "-f", "-")
	testenv.Eventually(t, 120*time.Second, "the container restarted and runs again", func() (bool, error) {
		out, _ := tkubectlErr(tc.kc, "get", "pod", "crasher", "-o",
			"jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}")
		count, started, _ := strings.Cut(out, " ")
		n, _ := strconv.Atoi(count)
		return n >= 1 && started != "", fmt.Errorf("restartCount and start %q\n%s", out, dump())
	})
	previous, err := tkubectlErr(tc.kc, "logs", "--previous", "crasher")
	if err != nil || !strings.Contains(previous, "run of ") {
		t.Fatalf("kubectl logs --previous: %v %q\n%s", err, previous, dump())
	}
	current, err := tkubectlErr(tc.kc, "logs", "crasher")
	if err != nil || !strings.Contains(current, "run of ") {
		t.Fatalf("kubectl logs: %v %q\n%s", err, current, dump())
	}
	if previous == current {
		t.Fatalf("kubectl logs --previous printed the current run's logs: %q", current)
	}
	t.Logf("previous run: %s; current run: %s", strings.TrimSpace(previous), strings.TrimSpace(current))
}
