package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/tenant/volumes"
	"socialweb.computer/internal/testenv"
)

// volumePod is a pod of claim "data" that runs script as user 1000 (not root: the volume's
// directory must be writable by any of the pods' users).
func volumePod(name, claim, script string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, runAsGroup: 1000}
  nodeSelector: {kubernetes.io/hostname: node-v}
  containers:
  - name: c
    image: ` + node.BusyboxImage + `
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "` + script + `"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: ` + claim + `}
`
}

func volumeClaim(name string) string {
	return `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ` + name + `, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
`
}

// A tenant cluster's default StorageClass local-path: a claim waits at zero nodes; once its
// pod is placed on a node the provisioner makes a hostPath volume in the node's volumes dir;
// a pod (as a non-root user) writes a file, and a new pod on the same node reads it back;
// deleting the claim deletes the volume and the node removes its directory. The same
// volume made by the tenant (a hostPath PV under the same dir, also while impersonating the
// provisioner's user) is refused, and so is a hostPath pod. When the node that held a volume
// is gone, the volume and its claim say so in an event; the node's volumes went with its
// work dir.
func TestVolumes_LocalPath(t *testing.T) {
	t.Parallel()
	const nodeName = "node-v"
	tc := joinableCluster(t, "vol", nodeName, 10*time.Minute)
	kc := tc.kc
	ctx := context.Background()
	ts := tenantClient(t, kc)

	// At zero nodes: the default class is there, and a claim waits for its first consumer.
	if out := tkubectl(t, kc, "", "get", "storageclass", volumes.StorageClassName, "-o",
		`jsonpath={.metadata.annotations.storageclass\.kubernetes\.io/is-default-class}/{.volumeBindingMode}/{.reclaimPolicy}/{.provisioner}`); out != "true/WaitForFirstConsumer/Delete/"+volumes.ProvisionerName {
		t.Fatalf("StorageClass %s: %q", volumes.StorageClassName, out)
	}
	tkubectl(t, kc, volumeClaim("data"), "apply", "-f", "-")
	time.Sleep(2 * time.Second)
	if out := tkubectl(t, kc, "", "get", "pvc", "data", "-o", "jsonpath={.status.phase}/{.spec.storageClassName}"); out != "Pending/"+volumes.StorageClassName {
		t.Fatalf("claim at zero nodes: %q, want Pending/%s", out, volumes.StorageClassName)
	}

	// The tenant may not make the provisioner's kind of volume itself: not as the owner, and
	// not impersonating the provisioner's user (the cluster's admin may impersonate anyone).
	forged := func(name string) string {
		return `apiVersion: v1
kind: PersistentVolume
metadata: {name: ` + name + `}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: ` + volumes.StorageClassName + `
  hostPath: {path: ` + volumes.PathFor(name) + `, type: DirectoryOrCreate}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [` + nodeName + `]}]
`
	}
	impersonating := func(extra map[string][]string) kubernetes.Interface {
		cfg, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Impersonate = rest.ImpersonationConfig{UserName: volumes.ProvisionerUser, Extra: extra}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	for who, c := range map[string]kubernetes.Interface{
		"the owner":                                   ts,
		"the provisioner's user, as the owner":        impersonating(nil),
		"the provisioner's user with a guessed proof": impersonating(map[string][]string{volumes.ProofExtraKey: {"guess"}}),
	} {
		var pv corev1.PersistentVolume
		if err := yaml.Unmarshal([]byte(forged("pvc-forged")), &pv); err != nil {
			t.Fatal(err)
		}
		_, err := c.CoreV1().PersistentVolumes().Create(ctx, &pv, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "node's own filesystem") {
			t.Errorf("a hostPath volume under %s made by %s: %v; want refused by the floor", volumes.NodeDir, who, err)
		}
	}
	hostPathPod := `apiVersion: v1
kind: Pod
metadata: {name: hostpath, namespace: default}
spec:
  containers:
  - {name: c, image: ` + node.BusyboxImage + `, imagePullPolicy: Never, command: ["/bin/true"], volumeMounts: [{name: v, mountPath: /v}]}
  volumes:
  - {name: v, hostPath: {path: ` + volumes.NodeDir + `}}
`
	if out, err := tkubectlIn(kc, hostPathPod, "apply", "-f", "-"); err == nil || !strings.Contains(out+err.Error(), "hostPath") {
		t.Errorf("a hostPath pod: %v %s; want refused", err, out)
	}

	// A node: the claim's pod lands there and its volume is made there.
	n := readyNode(t, tc, "vol-a", nodeName, nodeOptions{Lines: 20, Events: true})
	s, state, dump := n.S, n.State, n.Dump
	podDone := func(name string) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, "pod "+name+" Succeeded", func() (bool, error) {
			out, _ := tkubectlErr(kc, "get", "pod", name, "-o", `jsonpath={.status.phase}/{.spec.nodeName}`)
			if strings.HasPrefix(out, "Failed") {
				logs, _ := tkubectlErr(kc, "logs", name)
				t.Fatalf("pod %s failed: %s\n%s\n%s", name, out, logs, dump())
			}
			return out == "Succeeded/"+nodeName, fmt.Errorf("%q\n%s", out, dump())
		})
	}
	tkubectl(t, kc, volumePod("writer", "data", "set -e; echo kept-across-pods > /data/note; id -u"), "apply", "-f", "-")
	podDone("writer")

	claim, err := ts.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pvName := claim.Spec.VolumeName
	pv, err := ts.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("claim %s bound to %q: %v", claim.Status.Phase, pvName, err)
	}
	if pv.Spec.HostPath == nil || pv.Spec.HostPath.Path != volumes.PathFor(pvName) || pv.Spec.NodeAffinity == nil ||
		pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Fatalf("volume %s: %+v", pvName, pv.Spec)
	}
	// The node's work dir is its disk, mounted in its agent's mount namespace only
	// (docs/nodes.md): the host reads it through the agent.
	onHost := filepath.Join(agentRoot(t, filepath.Join(state, "vol-a")), state, "vol-a", "work", "volumes", pvName)
	if b, err := os.ReadFile(filepath.Join(onHost, "note")); err != nil || string(b) != "kept-across-pods\n" {
		t.Fatalf("the file on the node's own dir %s: %q %v", onHost, b, err)
	}
	// The same volume as the tenant's own object, under another name: refused.
	if out, err := tkubectlIn(kc, forged(pvName+"-copy"), "apply", "-f", "-"); err == nil {
		t.Errorf("a copy of the provisioner's volume was admitted: %s", out)
	}

	// The writer goes; a reader on the same node (the volume's affinity) reads the file.
	tkubectl(t, kc, "", "delete", "pod", "writer", "--wait=true")
	tkubectl(t, kc, volumePod("reader", "data", "cat /data/note"), "apply", "-f", "-")
	podDone("reader")
	if out, _ := tkubectlErr(kc, "logs", "reader"); out != "kept-across-pods\n" {
		t.Errorf("reader read %q, want the writer's note", out)
	}

	// The claim deleted: the volume is deleted, and its directory leaves the node.
	tkubectl(t, kc, "", "delete", "pod", "reader", "--wait=true")
	tkubectl(t, kc, "", "delete", "pvc", "data", "--wait=true")
	testenv.Eventually(t, 60*time.Second, "the volume deleted with its claim", func() (bool, error) {
		_, err := ts.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Errorf("volume %s: %v\n%s", pvName, err, dump())
	})
	testenv.Eventually(t, volumes.SweepGrace+30*time.Second, "the deleted volume's directory removed on the node", func() (bool, error) {
		_, err := os.Stat(onHost)
		list, _ := tkubectlErr(kc, "get", "node", nodeName, "-o", `jsonpath={.metadata.annotations.volumes\.socialweb\.computer/names}`)
		return os.IsNotExist(err), fmt.Errorf("%s: %v; the node's list %q\n%s", onHost, err, list, dump())
	})

	// A volume whose node is released: the node's volumes go with its work dir, and once its
	// Node is gone the volume and the claim carry an event saying the data is gone.
	tkubectl(t, kc, volumeClaim("kept"), "apply", "-f", "-")
	tkubectl(t, kc, volumePod("keeper", "kept", "set -e; echo x > /data/x"), "apply", "-f", "-")
	podDone("keeper")
	kept, err := ts.CoreV1().PersistentVolumeClaims("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || kept.Spec.VolumeName == "" {
		t.Fatalf("claim kept: %v %+v", err, kept)
	}
	if err := s.Stop(ctx, "vol-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(state, "vol-a", "work", "volumes")); !os.IsNotExist(err) {
		t.Errorf("the released node's volumes are still on the host: %v", err)
	}
	tkubectl(t, kc, "", "delete", "node", nodeName)
	testenv.Eventually(t, 30*time.Second, "events saying the volume's node is gone", func() (bool, error) {
		evs, err := ts.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "reason=" + volumes.ReasonNodeGone})
		if err != nil {
			return false, err
		}
		var pvSeen, claimSeen bool
		for _, e := range evs.Items {
			pvSeen = pvSeen || e.InvolvedObject.Kind == "PersistentVolume" && e.InvolvedObject.Name == kept.Spec.VolumeName
			claimSeen = claimSeen || e.InvolvedObject.Kind == "PersistentVolumeClaim" && e.InvolvedObject.Name == "kept"
		}
		return pvSeen && claimSeen, fmt.Errorf("%d events, on the volume %v, on the claim %v", len(evs.Items), pvSeen, claimSeen)
	})

	// A pod of that claim, with no node selector of its own, fits no node, now or new: the
	// Cluster's Scaling condition names its volume, rather than counting it as a pod a new
	// node would run.
	tkubectl(t, kc, strings.Replace(volumePod("orphan", "kept", "true"), "  nodeSelector: {kubernetes.io/hostname: node-v}\n", "", 1), "apply", "-f", "-")
	c := coreClient(t, tc.dir)
	testenv.Eventually(t, 30*time.Second, "the Scaling condition naming the orphan's volume", func() (bool, error) {
		var cl v1alpha1.Cluster
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vol"}, &cl); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(cl.Status.Conditions, string(v1alpha1.ConditionScaling))
		return cond != nil && strings.Contains(cond.Message, "default/orphan: its volume "+kept.Spec.VolumeName+" is on a node that is gone"), fmt.Errorf("%+v", cond)
	})
}

// tkubectlIn runs kubectl with stdin and returns its output and error.
func tkubectlIn(kubeconfig, stdin string, args ...string) (string, error) {
	var stderr strings.Builder
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), err
}

// TestNode_DiskIsBounded: a node's images, emptyDirs, volumes and logs live on a disk of
// its own (--node-disk-mib when the contract names none): the kubelet reports its size as
// the node's ephemeral-storage, a pod writing past it gets "No space left on device" in the
// node, and the host's file system loses no more than the disk. The disk is never on the
// host's mount table, while the node runs or after; once up and its nodes are stopped, no
// loop device backs it and the data dir is removed (t.TempDir's cleanup).
//
// Serial: it measures the host's free space, which rows beside it would spend.
func TestNode_DiskIsBounded(t *testing.T) {
	var dataDir string
	// Registered first, so run last: after the nodes are stopped and the data dir removed.
	t.Cleanup(func() {
		if dataDir == "" {
			return
		}
		testenv.Eventually(t, 10*time.Second, "no loop device left of the node's disk", func() (bool, error) {
			loops := loopsUnder(dataDir)
			return len(loops) == 0, fmt.Errorf("loop devices %v", loops)
		})
		if m := hostMountsUnder(t, dataDir); len(m) > 0 {
			t.Errorf("the host's mount table holds %v", m)
		}
	})
	n := startNodeUp(t, "--node-disk-mib", "512")
	dataDir = n.dir
	kc := n.cluster("disk", "maxNodes: 1")
	tkubectl(t, kc, `apiVersion: v1
kind: Pod
metadata: {name: filler, namespace: default}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: `+node.BusyboxImage+`
    imagePullPolicy: Never
    command: ["/bin/sleep", "3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {}}]
`, "apply", "-f", "-")
	nodeName := waitPod(t, kc, "filler", "Running", "", 180*time.Second)
	capacity := tkubectl(t, kc, "", "get", "node", nodeName, "-o", `jsonpath={.status.capacity.ephemeral-storage}`)
	q, err := resource.ParseQuantity(strings.TrimSpace(capacity))
	if err != nil || q.Value() > 512<<20 || q.Value() < 400<<20 {
		t.Fatalf("node %s reports ephemeral-storage %q (%v), want the 512 MiB disk's size", nodeName, capacity, err)
	}
	before, err := hostFreeMiB(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := inPod(kc, "filler", "/bin/busybox dd if=/dev/zero of=/scratch/fill bs=1048576 count=1024 2>&1; echo rc=$?")
	if !strings.Contains(out, "No space left on device") || strings.Contains(out, "rc=0") {
		t.Fatalf("writing 1 GiB on a 512 MiB node: %q, want No space left on device", out)
	}
	after, err := hostFreeMiB(n.dir)
	if err != nil {
		t.Fatal(err)
	}
	if used := before - after; used > 600 {
		t.Errorf("the host's file system lost %d MiB to a node whose disk is 512 MiB", used)
	}
	if m := hostMountsUnder(t, n.dir); len(m) > 0 {
		t.Errorf("a running node's disk is on the host's mount table: %v", m)
	}
	if loops := loopsUnder(n.dir); len(loops) != 1 {
		t.Errorf("loop devices of the running node's disk: %v, want one", loops)
	}
}

// hostMountsUnder lists this process's (the host's) mount points at or under dir.
func hostMountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// loopsUnder lists the loop devices whose backing file is under dir.
func loopsUnder(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir+"/") {
			out = append(out, strings.Split(f, "/")[3]+" "+strings.TrimSpace(string(b)))
		}
	}
	return out
}

// hostFreeMiB is what the file system holding path has free.
func hostFreeMiB(path string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize) >> 20, nil
}

// agentRoot is /proc/PID/root of the agent of the node in guest dir: the host's files as the
// agent's mount namespace shows them, the node's disk on its work dir among them.
func agentRoot(t *testing.T, guest string) string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		// The agent itself, not its supervisor (whose arguments name it too).
		b, err := os.ReadFile(p)
		if args := strings.Split(string(b), "\x00"); err == nil && len(args) > 2 && args[1] == "node-agent" && args[2] == guest {
			return filepath.Dir(p) + "/root"
		}
	}
	t.Fatalf("no node-agent process of %s", guest)
	return ""
}
