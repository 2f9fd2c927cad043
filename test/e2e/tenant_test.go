package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/tenant/gate"
	"socialweb.computer/internal/testenv"
)

const tenantOwner = "did:plc:e2etenantowner"

// requireTenantHost skips (fails under CI) when this host cannot give tenant apiservers their
// advertise address: root and iproute2 are needed for the network namespace and veth pair.
func requireTenantHost(t *testing.T) {
	t.Helper()
	requireTool(t, "kubectl")
	requireTool(t, "ip")
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the tenant rows need root (network namespace and veth pair)")
		}
		t.Skip("the tenant rows need root (network namespace and veth pair)")
	}
}

func coreClient(t *testing.T, dir string) client.Client {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	ctrllog.SetLogger(logr.Discard())
	c, err := client.New(cfg, client.Options{Scheme: manager.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitPhase(t *testing.T, c client.Client, key client.ObjectKey, phase v1alpha1.ClusterPhase, timeout time.Duration) *v1alpha1.Cluster {
	return waitPhaseNot(t, c, key, phase, "", timeout)
}

// waitPhaseNot waits for phase reported by an instance other than notInstance (after a
// restart the status read first is the one written before it).
func waitPhaseNot(t *testing.T, c client.Client, key client.ObjectKey, phase v1alpha1.ClusterPhase, notInstance string, timeout time.Duration) *v1alpha1.Cluster {
	t.Helper()
	var got v1alpha1.Cluster
	testenv.Eventually(t, timeout, "Cluster "+key.String()+" phase "+string(phase), func() (bool, error) {
		err := c.Get(context.Background(), key, &got)
		return err == nil && got.Status.Phase == phase && got.Status.ObservedGeneration == got.Generation &&
			(notInstance == "" || got.Status.Instance != notInstance), err
	})
	return &got
}

// childPID is the control plane's pid, from status.instance (<id>-<pid>).
func childPID(t *testing.T, c *v1alpha1.Cluster) int {
	t.Helper()
	i := strings.LastIndexByte(c.Status.Instance, '-')
	pid, err := strconv.Atoi(c.Status.Instance[i+1:])
	if err != nil {
		t.Fatalf("status.instance %q has no pid", c.Status.Instance)
	}
	return pid
}

func pidAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

// controlPlanesRunning lists the pids of `socialweb kube controlplane` processes for specs
// under dir.
func controlPlanesRunning(dir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), "kube\x00controlplane") && strings.Contains(string(b), dir) && pidAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mint writes the owner's kubeconfig of cluster c with `socialweb cluster kubeconfig`, as a
// user of up would.
func mint(t *testing.T, dir string, c *v1alpha1.Cluster) string {
	t.Helper()
	return mintFor(t, dir, c.Namespace, c.Name, "10m")
}

// mintFor is mint of the Cluster namespace/name, whose token lasts ttl.
func mintFor(t *testing.T, dir, namespace, name, ttl string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "tenant.kubeconfig")
	out, code := runCLI(t, "cluster", "kubeconfig", name, "-n", namespace, "--data-dir", dir, "--ttl", ttl, "-o", p)
	if code != 0 || !strings.Contains(out, "written to "+p) {
		t.Fatalf("socialweb cluster kubeconfig: exit %d: %s", code, out)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("minted kubeconfig %v %v, want mode 0600", fi, err)
	}
	return p
}

func tkubectl(t *testing.T, kubeconfig, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// caOnly is a TLS config trusting the cluster CA, without a client certificate.
func caOnly(t *testing.T, dir string, c *v1alpha1.Cluster) *tls.Config {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "tenants", c.Namespace, c.Name, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b)
	return &tls.Config{RootCAs: pool}
}

const pendingPod = `apiVersion: v1
kind: Pod
metadata:
  name: waits
  namespace: default
spec:
  containers:
  - name: c
    image: registry.invalid/pause:1
`

// The whole life of a tenant cluster against the real core and a real control plane:
// Ready at zero nodes, a pod Pending as Unschedulable, stopped with its objects kept, up
// again, back after a restart of `socialweb up`, and deleted: 503 while Draining before the
// processes exit, then nothing left on disk or in the process table.
func TestTenant_ClusterLifecycle(t *testing.T) {
	t.Parallel()
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	c := coreClient(t, dir)
	ctx := context.Background()
	key := client.ObjectKey{Namespace: "default", Name: "t1"}

	t0 := time.Now()
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: t1, namespace: default}
spec: {account: "`+tenantOwner+`", name: t1, running: true}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, key, v1alpha1.ClusterReady, 60*time.Second)
	t.Logf("created -> Ready in %.2fs; server %s, instance %s", time.Since(t0).Seconds(), cl.Status.Server, cl.Status.Instance)
	if cl.Status.Nodes != 0 || !strings.HasPrefix(cl.Status.Server, "https://127.0.0.1:") {
		t.Errorf("status %+v", cl.Status)
	}
	var withFinalizer v1alpha1.Cluster
	_ = c.Get(ctx, key, &withFinalizer)
	if !strings.Contains(strings.Join(withFinalizer.Finalizers, ","), v1alpha1.FinalizerClusterTeardown) {
		t.Errorf("finalizers %v", withFinalizer.Finalizers)
	}

	kc := mint(t, dir, cl)
	if out := tkubectl(t, kc, "", "get", "nodes", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("nodes of a zero-node cluster: %q", out)
	}
	ns := tkubectl(t, kc, "", "get", "ns", "-o", "name")
	for _, n := range tenant.DefaultNamespaces {
		if !strings.Contains(ns, "namespace/"+n) {
			t.Errorf("namespaces lack %s:\n%s", n, ns)
		}
	}
	var ver struct {
		ServerVersion struct{ GitVersion string } `json:"serverVersion"`
	}
	_ = json.Unmarshal([]byte(tkubectl(t, kc, "", "version", "-o", "json")), &ver)
	if !strings.HasPrefix(ver.ServerVersion.GitVersion, "v1.37") {
		t.Errorf("server version %q, want v1.37.x (the version ldflags)", ver.ServerVersion.GitVersion)
	}
	// Through the gate without a certificate: the tenant apiserver's own 401.
	if code, body, err := gate.Probe(cl.Status.Server, caOnly(t, dir, cl)); err != nil || code != 401 {
		t.Errorf("without a certificate: %d %s %v; want the apiserver's 401", code, body, err)
	}
	// The owner's ServiceAccount may apply on the owner's behalf.
	sa := "system:serviceaccount:" + tenant.OwnerNamespace + ":" + tenant.OwnerServiceAccount(tenantOwner)
	if out := tkubectl(t, kc, "", "auth", "can-i", "create", "deployments", "--as", sa); strings.TrimSpace(out) != "yes" {
		t.Errorf("owner ServiceAccount can-i create deployments: %q", out)
	}

	// A token of that ServiceAccount (signed with the cluster's service-account key) is
	// accepted through the gate.
	token := strings.TrimSpace(tkubectl(t, kc, "", "create", "token", tenant.OwnerServiceAccount(tenantOwner), "-n", tenant.OwnerNamespace))
	caFile := filepath.Join(dir, "tenants", "default", "t1", "pki", "ca.crt")
	if out, err := exec.Command("kubectl", "--kubeconfig=/dev/null", "--server", cl.Status.Server, "--certificate-authority", caFile,
		"--token", token, "auth", "can-i", "create", "deployments").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "yes" {
		t.Errorf("with the ServiceAccount's token: %v %s", err, out)
	}

	tkubectl(t, kc, pendingPod, "apply", "-f", "-")
	tkubectl(t, kc, "", "create", "configmap", "kept", "--from-literal=a=b")
	testenv.Eventually(t, 30*time.Second, "pod Pending as Unschedulable", func() (bool, error) {
		out := tkubectl(t, kc, "", "get", "pod", "waits", "-o", `jsonpath={.status.phase}/{.status.conditions[?(@.type=="PodScheduled")].reason}`)
		return out == "Pending/Unschedulable", fmt.Errorf("%s", out)
	})

	// running: false stops the processes and keeps the store.
	pid := childPID(t, cl)
	if err := c.Patch(ctx, cl, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"running":false}}`))); err != nil {
		t.Fatal(err)
	}
	stopped := waitPhase(t, c, key, v1alpha1.ClusterUnavailable, 60*time.Second)
	if pidAlive(pid) {
		t.Errorf("control plane %d still running after running: false", pid)
	}
	if _, err := os.Stat(filepath.Join(dir, "tenants", "default", "t1", "etcd")); err != nil {
		t.Errorf("store of a stopped cluster: %v", err)
	}
	if code, _, _ := gate.Probe(stopped.Status.Server, caOnly(t, dir, cl)); code != 503 {
		t.Errorf("gate of a stopped cluster answers %d, want 503", code)
	}

	t1 := time.Now()
	if err := c.Patch(ctx, stopped, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"running":true}}`))); err != nil {
		t.Fatal(err)
	}
	cl = waitPhase(t, c, key, v1alpha1.ClusterReady, 60*time.Second)
	t.Logf("controlPlaneUp (stopped -> Ready) in %.2fs", time.Since(t1).Seconds())
	if out := tkubectl(t, kc, "", "get", "pod,configmap", "-o", "name"); !strings.Contains(out, "pod/waits") || !strings.Contains(out, "configmap/kept") {
		t.Errorf("after up again, objects are missing:\n%s", out)
	}

	// A restart of `socialweb up` stops the control plane with it and brings it back Ready.
	pid = childPID(t, cl)
	up.stop(t)
	if pidAlive(pid) || len(controlPlanesRunning(dir)) != 0 {
		t.Errorf("control planes left running after up stopped: %v", controlPlanesRunning(dir))
	}
	startUp(t, dir)
	c = coreClient(t, dir)
	t2 := time.Now()
	cl = waitPhaseNot(t, c, key, v1alpha1.ClusterReady, cl.Status.Instance, 60*time.Second)
	t.Logf("after restarting up: Ready %.2fs after up was ready", time.Since(t2).Seconds())
	if out := tkubectl(t, kc, "", "get", "pod", "waits", "-o", "name"); strings.TrimSpace(out) != "pod/waits" {
		t.Errorf("after restarting up: %q", out)
	}

	// A crash is reported on the Cluster and the control plane restarted, store intact.
	crashed := childPID(t, cl)
	if err := syscall.Kill(crashed, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sawCrash := false
	testenv.Eventually(t, 60*time.Second, "Ready again after a crash", func() (bool, error) {
		var got v1alpha1.Cluster
		if err := c.Get(ctx, key, &got); err != nil {
			return false, err
		}
		if cond := meta.FindStatusCondition(got.Status.Conditions, string(v1alpha1.ConditionReady)); cond != nil && cond.Reason == "Crashed" {
			sawCrash = true
		}
		cl = &got
		return got.Status.Phase == v1alpha1.ClusterReady && got.Status.Instance != "" && childPID(t, &got) != crashed, nil
	})
	// The Crashed reason lasts only until the restart is Ready, which a poll can miss; the
	// Ready condition's message keeps the report (the restart count and the exit).
	if cond := meta.FindStatusCondition(cl.Status.Conditions, string(v1alpha1.ConditionReady)); cond == nil ||
		!strings.Contains(cond.Message, "restarted 1 times") || !strings.Contains(cond.Message, "killed") {
		t.Errorf("crash seen while polling %v; Ready condition after the restart: %+v", sawCrash, cond)
	}
	if out := tkubectl(t, kc, "", "get", "configmap", "kept", "-o", "name"); strings.TrimSpace(out) != "configmap/kept" {
		t.Errorf("after a crash: %q", out)
	}

	// Delete: Draining answers 503 before the processes exit, then nothing is left.
	pid = childPID(t, cl)
	type sample struct {
		code  int
		alive bool
	}
	var mu sync.Mutex
	var samples []sample
	stop := make(chan struct{})
	sampled := make(chan struct{})
	tlsCfg := caOnly(t, dir, cl)
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			alive := pidAlive(pid)
			code, _, _ := gate.Probe(cl.Status.Server, tlsCfg)
			mu.Lock()
			samples = append(samples, sample{code, alive && pidAlive(pid)})
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	if err := c.Delete(ctx, cl); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the Cluster is gone", func() (bool, error) {
		err := c.Get(ctx, key, &v1alpha1.Cluster{})
		return client.IgnoreNotFound(err) == nil && err != nil, err
	})
	close(stop)
	<-sampled
	saw503Alive, saw401After503 := false, false
	seen503 := false
	for _, s := range samples {
		if s.code == 503 {
			seen503 = true
			saw503Alive = saw503Alive || s.alive
		}
		if seen503 && s.code == 401 {
			saw401After503 = true
		}
	}
	if !saw503Alive || saw401After503 {
		t.Errorf("gate during delete: 503 while the control plane was alive %v, served again after 503 %v (%d samples)", saw503Alive, saw401After503, len(samples))
	}
	if pidAlive(pid) || len(controlPlanesRunning(dir)) != 0 {
		t.Errorf("control plane processes left: %v", controlPlanesRunning(dir))
	}
	if _, err := os.Stat(filepath.Join(dir, "tenants", "default", "t1")); !os.IsNotExist(err) {
		t.Errorf("cluster directory left after delete: %v", err)
	}
}

// TestTenant_DeepDataDir: a data dir deep enough that its sockets' paths are longer than a
// unix socket address holds (the core's etcd.sock, and a tenant cluster's under
// tenants/NAMESPACE/NAME) still serves: up is ready and a cluster becomes Ready.
func TestTenant_DeepDataDir(t *testing.T) {
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 50), strings.Repeat("e", 40), "data")
	if n := len(filepath.Join(dir, "etcd.sock")); n <= 108 {
		t.Fatalf("the core's socket path is %d bytes: the row cannot tell", n)
	}
	up := startUp(t, dir)
	c := coreClient(t, dir)
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: deep, namespace: default}
spec: {account: "`+tenantOwner+`", name: deep, running: true, maxNodes: 0}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: "deep"}, v1alpha1.ClusterReady, 90*time.Second)
	tkubectl(t, mint(t, dir, cl), "", "get", "namespaces")
}
