package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/testenv"
)

// kubectlTry runs kubectl and returns its stdout, stderr and error, for rows that expect a
// refusal or a warning.
func kubectlTry(kubeconfig, stdin string, args ...string) (string, string, error) {
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return string(out), stderr.String(), err
}

// escapePod is a pod whose spec carries extra (host namespaces) and securityContext, with
// the node's / mounted, whose command, if it ever ran on a node, would write marker on the
// host through /host.
func escapePod(name, namespace, extra, securityContext, marker string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: ` + namespace + `}
spec:
  restartPolicy: Never
` + extra + `
  containers:
  - name: c
    image: socialweb.computer/pause:local
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo escaped > /host` + marker + `; cat /proc/1/root/etc/shadow"]
    volumeMounts: [{name: host, mountPath: /host}]
    securityContext: ` + securityContext + `
  volumes: [{name: host, hostPath: {path: /}}]
`
}

// The escape table at the tenant apiserver: every way a pod spec reaches the node's host is
// refused for the owner (a cluster-admin), whatever the namespace's labels, and the host is
// untouched. Pods that pass baseline but not restricted are admitted with restricted's
// warning; an owner's restricted choice refuses them; PersistentVolumes on a node's own
// filesystem are refused.
func TestSecurity_TenantPodSecurity(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	c := coreClient(t, dir)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "default", Name: "ps1"}
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: ps1, namespace: default}
spec: {account: "`+tenantOwner+`", name: ps1, running: true, maxNodes: 1}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, key, v1alpha1.ClusterReady, 90*time.Second)
	if cl.Status.PodSecurity != "baseline" {
		t.Errorf("status.podSecurity %q, want baseline (up's default floor)", cl.Status.PodSecurity)
	}
	kc := mint(t, dir, cl)
	marker := filepath.Join(t.TempDir(), "escaped") // outside the data dir

	tkubectl(t, kc, "", "create", "namespace", "loose")
	// The owner may label a namespace privileged; the label changes nothing.
	tkubectl(t, kc, "", "label", "namespace", "loose", "pod-security.kubernetes.io/enforce=privileged")

	// A privileged container is refused by the apiserver's own validation
	// (--allow-privileged=false), before admission; every other row by Pod Security.
	const notPrivileged = "{}"
	for _, row := range []struct {
		name, namespace, extra, securityContext, refusal, want string
	}{
		{"privileged", "default", "", "{privileged: true}", "Forbidden: disallowed by cluster policy", "securityContext.privileged"},
		{"privileged-in-privileged-namespace", "loose", "", "{privileged: true}", "Forbidden: disallowed by cluster policy", "securityContext.privileged"},
		{"hostpath-root", "default", "", notPrivileged, `violates PodSecurity "baseline:latest"`, `hostPath volumes (volume "host")`},
		{"sys-admin", "default", "", "{capabilities: {add: [SYS_ADMIN]}}", `violates PodSecurity "baseline:latest"`, `non-default capabilities (container "c" must not include "SYS_ADMIN"`},
		{"hostpid", "default", "  hostPID: true", notPrivileged, `violates PodSecurity "baseline:latest"`, "host namespaces (hostPID=true)"},
		{"hostnetwork", "default", "  hostNetwork: true", notPrivileged, `violates PodSecurity "baseline:latest"`, "host namespaces (hostNetwork=true)"},
		{"hostpid-in-privileged-namespace", "loose", "  hostPID: true\n  hostNetwork: true", notPrivileged, `violates PodSecurity "baseline:latest"`, "host namespaces (hostNetwork=true, hostPID=true)"},
	} {
		_, stderr, err := kubectlTry(kc, escapePod(row.name, row.namespace, row.extra, row.securityContext, marker), "apply", "-f", "-")
		if err == nil {
			t.Errorf("%s: admitted", row.name)
			continue
		}
		if !strings.Contains(stderr, row.refusal) || !strings.Contains(stderr, row.want) {
			t.Errorf("%s: refused with %q; want a PodSecurity refusal naming %s", row.name, stderr, row.want)
		}
		if row.namespace == "loose" && strings.Contains(row.refusal, "PodSecurity") && !strings.Contains(stderr, "whatever the namespace's labels") {
			t.Errorf("%s: refusal does not say the provider's level applies whatever the labels: %q", row.name, stderr)
		}
	}

	// A Deployment of the same pod is stored (its template only warns), but no pod is ever
	// created: its ReplicaSet reports the refusal.
	deploy := `apiVersion: apps/v1
kind: Deployment
metadata: {name: escaper, namespace: default}
spec:
  selector: {matchLabels: {app: escaper}}
  template:
    metadata: {labels: {app: escaper}}
    spec:
      hostPID: true
      containers: [{name: c, image: socialweb.computer/pause:local, imagePullPolicy: Never}]
`
	if _, stderr, err := kubectlTry(kc, deploy, "apply", "-f", "-"); err != nil || !strings.Contains(stderr, "would violate PodSecurity") {
		t.Errorf("deployment: %v %q; want stored with a warning", err, stderr)
	}
	testenv.Eventually(t, 30*time.Second, "the ReplicaSet reports FailedCreate by PodSecurity", func() (bool, error) {
		out := tkubectl(t, kc, "", "get", "events", "-n", "default", "--field-selector", "reason=FailedCreate", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(out, `violates PodSecurity "baseline:latest"`), nil
	})

	// A PersistentVolume on the node's filesystem, which a claim would mount past Pod Security.
	pv := `apiVersion: v1
kind: PersistentVolume
metadata: {name: host-root}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /}
`
	if _, stderr, err := kubectlTry(kc, pv, "apply", "-f", "-"); err == nil || !strings.Contains(stderr, "spec.hostPath mounts a node's own filesystem") {
		t.Errorf("hostPath PersistentVolume: %v %q; want refused", err, stderr)
	}

	// A plain pod passes baseline with restricted's warning.
	plain := `apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: default}
spec:
  containers: [{name: c, image: registry.invalid/pause:1}]
`
	if _, stderr, err := kubectlTry(kc, plain, "apply", "-f", "-"); err != nil || !strings.Contains(stderr, `would violate PodSecurity "restricted:latest"`) {
		t.Errorf("plain pod: %v %q; want admitted with restricted's warning", err, stderr)
	}

	if out := tkubectl(t, kc, "", "get", "pods", "-A", "-o", "name"); strings.TrimSpace(out) != "pod/plain" {
		t.Errorf("pods: %q; want only the plain one", out)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("marker %s on the host: %v", marker, err)
	}

	// The owner tightens the cluster to restricted: the control plane restarts with it.
	before := cl.Status.Instance
	if err := c.Patch(ctx, cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"podSecurity":"restricted"}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "Ready again, enforcing restricted", func() (bool, error) {
		var now v1alpha1.Cluster
		if err := c.Get(ctx, key, &now); err != nil {
			return false, err
		}
		return now.Status.Phase == v1alpha1.ClusterReady && now.Status.PodSecurity == "restricted" && now.Status.Instance != before, nil
	})
	if _, stderr, err := kubectlTry(kc, strings.Replace(plain, "name: plain", "name: plain2", 1), "apply", "-f", "-"); err == nil || !strings.Contains(stderr, `violates PodSecurity "restricted:latest"`) {
		t.Errorf("plain pod under restricted: %v %q; want refused", err, stderr)
	}
	compliant := `apiVersion: v1
kind: Pod
metadata: {name: compliant, namespace: default}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: c
    image: registry.invalid/pause:1
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
`
	if _, stderr, err := kubectlTry(kc, compliant, "apply", "-f", "-"); err != nil {
		t.Errorf("restricted-compliant pod refused: %v %q", err, stderr)
	}

	// The admitted pods rent a node: deleting the cluster releases it before up stops.
	var now v1alpha1.Cluster
	if err := c.Get(ctx, key, &now); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &now); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "the Cluster is gone", func() (bool, error) {
		err := c.Get(ctx, key, &v1alpha1.Cluster{})
		return client.IgnoreNotFound(err) == nil && err != nil, err
	})
}

// The operator's floor: `up --pod-security restricted` makes every cluster restricted, and
// an owner's baseline does not loosen it; up refuses a level it does not offer.
func TestSecurity_TenantPodSecurityOperatorFloor(t *testing.T) {
	requireTenantHost(t)
	if out, code := runCLI(t, "up", "--data-dir", filepath.Join(t.TempDir(), "data"), "--pod-security", "privileged"); code == 0 || !strings.Contains(out, "privileged is never offered to tenants") {
		t.Errorf("up --pod-security privileged: exit %d: %s", code, out)
	}
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir, "--pod-security", "restricted")
	c := coreClient(t, dir)
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: ps2, namespace: default}
spec: {account: "`+tenantOwner+`", name: ps2, running: true, podSecurity: baseline}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: "ps2"}, v1alpha1.ClusterReady, 90*time.Second)
	if cl.Status.PodSecurity != "restricted" {
		t.Errorf("status.podSecurity %q, want restricted (the operator's floor)", cl.Status.PodSecurity)
	}
	plain := `apiVersion: v1
kind: Pod
metadata: {name: plain, namespace: default}
spec:
  containers: [{name: c, image: registry.invalid/pause:1}]
`
	if _, stderr, err := kubectlTry(mint(t, dir, cl), plain, "apply", "-f", "-"); err == nil || !strings.Contains(stderr, `violates PodSecurity "restricted:latest"`) {
		t.Errorf("plain pod: %v %q; want refused by the operator's restricted floor", err, stderr)
	}
}
