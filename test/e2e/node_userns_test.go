package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/testenv"
)

// usernsPod is a pod whose container (uid 0 in it) prints its uid map and then sleeps for
// marker seconds: the marker finds its process on the host.
func usernsPod(name string, hostUsers bool, marker int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  hostUsers: %v
  automountServiceAccountToken: false
  containers:
  - name: c
    image: %s
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo uid_map $(cat /proc/self/uid_map); echo id $(id -u); exec sleep %d"]
`, name, hostUsers, node.BusyboxImage, marker)
}

// hostUIDOf is the real uid, on the host, of the process whose command line is
// `sleep <marker>`, or -1 when there is none.
func hostUIDOf(marker int) int {
	want := []byte("sleep\x00" + strconv.Itoa(marker) + "\x00")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, want) {
			continue
		}
		st, err := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(st))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "Uid:" {
				uid, _ := strconv.Atoi(f[1])
				return uid
			}
		}
	}
	return -1
}

// bootRuntimeNode boots a node with the given node runtime (node.Config.RuntimeDir) as
// nodeName of tc's cluster and waits for it to be Ready.
func bootRuntimeNode(t *testing.T, tc tenantToJoin, id, nodeName, runtimeDir string) (dump func() string) {
	t.Helper()
	return readyNode(t, tc, id, nodeName, nodeOptions{RuntimeDir: runtimeDir, DNSUpstream: "none",
		Logs: []string{"log", "kubelet.log", "containerd.log"}, Lines: 15}).Dump
}

// A pod with hostUsers: false runs in a user namespace of its own on a node of the node
// runtime (containerd v2, runc 1.5): uid 0 in it is an unprivileged uid on the provider's
// host. A pod without it, on the same node, runs as host root (the check sees uid 0 when it
// is there).
func TestNode_UserNamespacePodIsNotHostRoot(t *testing.T) {
	t.Parallel()
	const nodeName = "node-userns"
	tc := joinableCluster(t, "un1", nodeName, 10*time.Minute)
	dump := bootRuntimeNode(t, tc, "un1-a", nodeName, "")
	if l, _ := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", "jsonpath={.metadata.labels}"); !strings.Contains(l, `"`+node.LabelUserNamespaces+`":"true"`) {
		t.Fatalf("the Node does not say it runs user namespaces: labels %s", l)
	}
	usersMarker, rootMarker := 1_000_000+rand.IntN(1_000_000), 3_000_000+rand.IntN(1_000_000)
	tkubectl(t, tc.kc, usernsPod("userns", false, usersMarker), "apply", "-f", "-")
	tkubectl(t, tc.kc, usernsPod("hostusers", true, rootMarker), "apply", "-f", "-")
	var usersUID, rootUID int
	testenv.Eventually(t, 120*time.Second, "both pods' processes on the host", func() (bool, error) {
		usersUID, rootUID = hostUIDOf(usersMarker), hostUIDOf(rootMarker)
		phases, _ := tkubectlErr(tc.kc, "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name}={.status.phase} {.status.containerStatuses[0].state}{\"\\n\"}{end}")
		return usersUID >= 0 && rootUID >= 0, fmt.Errorf("host uids %d %d; pods:\n%s\n%s", usersUID, rootUID, phases, dump())
	})
	logs, _ := tkubectlErr(tc.kc, "logs", "userns")
	t.Logf("hostUsers: false: host uid %d; in the pod: %s", usersUID, strings.Join(strings.Fields(logs), " "))
	if usersUID == 0 {
		t.Fatalf("the hostUsers: false pod's uid 0 is host root\n%s", dump())
	}
	if !strings.Contains(logs, "id 0") || strings.Contains(logs, "uid_map 0 0 4294967295") {
		t.Fatalf("the hostUsers: false pod is not uid 0 in a user namespace of its own: %q", logs)
	}
	if f := strings.Fields(strings.TrimPrefix(strings.SplitN(logs, "\n", 2)[0], "uid_map")); len(f) != 3 || f[1] != strconv.Itoa(usersUID) {
		t.Fatalf("uid_map %v does not map uid 0 to the host uid %d", f, usersUID)
	}
	if rootUID != 0 {
		t.Fatalf("the hostUsers pod runs as host uid %d, want 0 (the check cannot tell)", rootUID)
	}
	t.Logf("hostUsers: true: host uid %d", rootUID)
}

// On the host's runtime (Debian's containerd 1.6, runc 1.1) a pod with hostUsers: false
// does not get a user namespace: the row reports whether the kubelet refused it or it ran as
// host root, and fails if it ran as host root unnoticed (it never runs unmapped silently).
func TestNode_UserNamespacePodOnTheHostRuntime(t *testing.T) {
	t.Parallel()
	const nodeName = "node-userns-host"
	tc := joinableCluster(t, "un2", nodeName, 10*time.Minute)
	dump := bootRuntimeNode(t, tc, "un2-a", nodeName, node.HostRuntime)
	if l, _ := tkubectlErr(tc.kc, "get", "node", nodeName, "-o", "jsonpath={.metadata.labels}"); strings.Contains(l, node.LabelUserNamespaces) {
		t.Fatalf("a Node of the host's runtime says it runs user namespaces: labels %s", l)
	}
	marker := 5_000_000 + rand.IntN(1_000_000)
	tkubectl(t, tc.kc, usernsPod("userns", false, marker), "apply", "-f", "-")
	var uid int
	var refusal string
	testenv.Eventually(t, 120*time.Second, "the pod refused or running", func() (bool, error) {
		if uid = hostUIDOf(marker); uid >= 0 {
			return true, nil
		}
		ev, _ := tkubectlErr(tc.kc, "get", "events", "--field-selector", "involvedObject.name=userns", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		for _, l := range strings.Split(ev, "\n") {
			if strings.Contains(strings.ToLower(l), "user namespace") {
				refusal = l
				return true, nil
			}
		}
		return false, fmt.Errorf("events:\n%s\n%s", ev, dump())
	})
	if uid >= 0 {
		t.Fatalf("on the host's runtime the hostUsers: false pod ran as host uid %d", uid)
	}
	t.Logf("the host's runtime refuses hostUsers: false: %s", refusal)
}
