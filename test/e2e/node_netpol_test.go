package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// httpdCmd serves "<name>-ok" on 8080.
func httpdCmd(name string) string {
	return `["/bin/sh", "-c", "mkdir -p /tmp/www && echo ` + name + `-ok > /tmp/www/index.html && exec /bin/busybox httpd -f -p 8080 -h /tmp/www"]`
}

// netpolPods: a web server (app=web, its port named http, with a readiness probe the node
// sends), a client (role=client), a stranger (no labels, serving too) and a visitor in a
// namespace labelled team=blue.
var netpolPods = `apiVersion: v1
kind: Namespace
metadata: {name: np-blue, labels: {team: blue}}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ` + httpdCmd("web") + `
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1, failureThreshold: 1, timeoutSeconds: 1}
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
  - {name: c, image: ` + node.BusyboxImage + `, imagePullPolicy: Never, command: ` + httpdCmd("stranger") + `}
---
apiVersion: v1
kind: Pod
metadata: {name: visitor, namespace: np-blue}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: ` + node.BusyboxImage + `, imagePullPolicy: Never, command: ["/bin/sleep", "3600"]}
`

// webIngress lets into app=web, on its port named http, only role=client pods of its
// namespace and the pods of namespaces labelled team=blue.
const webIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector: {matchLabels: {role: client}}
    - namespaceSelector: {matchLabels: {team: blue}}
    ports: [{protocol: TCP, port: http}]
`

// clientEgress lets role=client pods send only to app=web, on 8080.
const clientEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: web}}}]
    ports: [{protocol: TCP, port: 8080}]
`

// NetworkPolicy is enforced on the node: an ingress policy (a podSelector and a
// namespaceSelector peer, a named port) lets only the pods it names reach the pod it
// selects, while the node's own readiness probes still do; an egress policy lets a pod reach
// only the pod it names; without the policies every pod reaches every other again.
func TestNode_NetworkPolicyEnforced(t *testing.T) {
	t.Parallel()
	const nodeName = "node-np"
	tc := joinableCluster(t, "np1", nodeName, 10*time.Minute)
	dump := readyNode(t, tc, "np1-a", nodeName, nodeOptions{Logs: []string{"log", "netpol.log", "kubelet.log"}, Lines: 20}).Dump
	tkubectl(t, tc.kc, netpolPods, "apply", "-f", "-")
	for _, p := range []string{"web", "client", "stranger"} {
		waitPod(t, tc.kc, p, "Running", nodeName, 120*time.Second)
	}
	testenv.Eventually(t, 120*time.Second, "visitor Running", func() (bool, error) {
		out, err := tkubectlErr(tc.kc, "-n", "np-blue", "get", "pod", "visitor", "-o", "jsonpath={.status.phase}")
		return out == "Running", fmt.Errorf("%q %v", out, err)
	})
	podIP := func(name string) string {
		return tkubectl(t, tc.kc, "", "get", "pod", name, "-o", "jsonpath={.status.podIP}")
	}
	ips := map[string]string{"web": podIP("web"), "stranger": podIP("stranger")}
	fetch := func(from, to string) (string, error) {
		ns := "default"
		if from == "visitor" {
			ns = "np-blue"
		}
		// busybox's own timeout: its wget -T crashes when a connection fails.
		return tkubectlErr(tc.kc, "-n", ns, "exec", from, "--", "/bin/busybox", "timeout", "3", "/bin/busybox", "wget", "-qO-", "http://"+ips[to]+":8080/")
	}
	reaches := func(from, to string, want bool) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s reaches %s: %v", from, to, want), func() (bool, error) {
			out, err := fetch(from, to)
			got := err == nil && strings.Contains(out, to+"-ok")
			return got == want, fmt.Errorf("%q %v\n%s", out, err, dump())
		})
	}
	// refused checks, a while after the rules changed, that a pod is still refused: not a
	// race the enforcement lost once.
	refused := func(from, to string) {
		t.Helper()
		if out, err := fetch(from, to); err == nil {
			t.Errorf("%s reached %s, which the policies do not allow: %q\n%s", from, to, out, dump())
		}
	}
	ready := func() string {
		return tkubectl(t, tc.kc, "", "get", "pod", "web", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	}
	for _, from := range []string{"client", "stranger", "visitor"} {
		reaches(from, "web", true)
	}
	reaches("client", "stranger", true)

	// Ingress: a podSelector peer, a namespaceSelector peer, a named port.
	tkubectl(t, tc.kc, webIngress, "apply", "-f", "-")
	reaches("stranger", "web", false)
	reaches("client", "web", true)
	reaches("visitor", "web", true)
	time.Sleep(2 * time.Second)
	refused("stranger", "web")
	// The kubelet probes web every second and gives up after one failure: from the node,
	// web is still reached.
	if r := ready(); r != "True" {
		t.Errorf("web is Ready=%q under an ingress policy: the node's probes were refused\n%s", r, dump())
	}

	// Egress: the client may send only to web.
	tkubectl(t, tc.kc, clientEgress, "apply", "-f", "-")
	reaches("client", "stranger", false)
	reaches("client", "web", true)
	time.Sleep(2 * time.Second)
	refused("client", "stranger")
	refused("stranger", "web")
	reaches("visitor", "web", true)

	// A new pod under the egress policy tries the stranger the moment its container starts:
	// its sandbox waited at the node's CNI until the rules held its address, so even the
	// first try is refused (learnt from the apiserver alone, the address reached the rules
	// only after the pod had started, and the first tries went through).
	tkubectl(t, tc.kc, `apiVersion: v1
kind: Pod
metadata: {name: early, namespace: default, labels: {role: client}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: `+node.BusyboxImage+`
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "for i in 1 2 3; do /bin/busybox timeout 1 /bin/busybox wget -qO- http://`+ips["stranger"]+`:8080/ && echo LEAKED; done; echo DONE; exec /bin/sleep 3600"]
`, "apply", "-f", "-")
	var early string
	testenv.Eventually(t, 120*time.Second, "early pod's tries done", func() (bool, error) {
		var err error
		early, err = tkubectlErr(tc.kc, "logs", "early")
		return strings.Contains(early, "DONE"), fmt.Errorf("%q %v", early, err)
	})
	if strings.Contains(early, "LEAKED") || strings.Contains(early, "stranger-ok") {
		t.Errorf("a new pod under an egress policy reached the stranger before its rules held: %q\n%s", early, dump())
	}
	tkubectl(t, tc.kc, "", "delete", "pod", "early", "--wait=false")

	tkubectl(t, tc.kc, "", "delete", "networkpolicy", "web-ingress", "client-egress")
	reaches("stranger", "web", true)
	reaches("client", "stranger", true)
	if r := ready(); r != "True" {
		t.Errorf("web is Ready=%q", r)
	}
}
