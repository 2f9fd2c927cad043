package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// netpolPods: a web server (app=web) and two clients, one labelled role=client.
const netpolPods = `apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "mkdir -p /tmp/www && echo web-ok > /tmp/www/index.html && exec /bin/busybox httpd -f -p 8080 -h /tmp/www"]
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: default, labels: {role: client}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: ` + node.BusyboxImage + `, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: stranger, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: ` + node.BusyboxImage + `, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
`

// webOnlyFromClients lets only role=client pods reach app=web, on 8080.
const webOnlyFromClients = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-clients, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
    ports: [{protocol: TCP, port: 8080}]
`

// A NetworkPolicy is enforced on the node: with it, only the pods it allows reach the pod it
// selects; without it, every pod does again.
func TestNode_NetworkPolicyEnforced(t *testing.T) {
	const nodeName = "node-np"
	tc := joinableCluster(t, "np1", nodeName, 10*time.Minute)
	state := filepath.Join(t.TempDir(), "nodes")
	s, err := node.New(node.Config{StateDir: state, Binary: socialwebBin, ImageDir: tc.images})
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)
	bootNode(t, s, "np1-a", nodeName, tc.bundle)
	dump := func() string {
		var b strings.Builder
		for _, f := range []string{"log", "netpol.log", "kubelet.log"} {
			out, _ := guestproc.Tail(filepath.Join(state, "np1-a", f), 20)
			fmt.Fprintf(&b, "--- %s\n%s\n", f, out)
		}
		return b.String()
	}
	tkubectl(t, tc.kc, netpolPods, "apply", "-f", "-")
	for _, p := range []string{"web", "client", "stranger"} {
		waitPod(t, tc.kc, p, "Running", nodeName, 120*time.Second)
	}
	ip := tkubectl(t, tc.kc, "", "get", "pod", "web", "-o", "jsonpath={.status.podIP}")
	fetch := func(from string) (string, error) {
		return tkubectlErr(tc.kc, "exec", from, "--", "/bin/busybox", "wget", "-T", "3", "-qO-", "http://"+ip+":8080/")
	}
	reaches := func(from string, want bool) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s reaches web: %v", from, want), func() (bool, error) {
			out, err := fetch(from)
			got := err == nil && strings.Contains(out, "web-ok")
			return got == want, fmt.Errorf("%q %v\n%s", out, err, dump())
		})
	}
	reaches("client", true)
	reaches("stranger", true)

	tkubectl(t, tc.kc, webOnlyFromClients, "apply", "-f", "-")
	reaches("stranger", false)
	reaches("client", true)
	// Still refused a while later: not a race the engine lost once.
	time.Sleep(2 * time.Second)
	if out, err := fetch("stranger"); err == nil {
		t.Errorf("a pod the policy does not allow reached web: %q", out)
	}

	tkubectl(t, tc.kc, "", "delete", "networkpolicy", "web-from-clients")
	reaches("stranger", true)
}
