package nodehost_test

// Suites of the node host against the real embedded core and a real tenant control plane
// (the child process `socialweb kube controlplane`, run by the real Cluster controller and
// tenant.Manager). No kubelet guest exists yet: the suites named DrivenNodes create Node
// objects in the tenant apiserver and set their Ready condition from the test, as a
// kubelet would.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/cluster"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodehost"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

const (
	ns    = "acct-nodehost"
	owner = "did:plc:nodehostowner"
)

// socialwebBin runs the tenant control planes: SOCIALWEB_TEST_BIN, else built once here
// (the first build compiles k8s.io/kubernetes; cached after).
var socialwebBin string

func TestMain(m *testing.M) {
	flag.Parse()
	socialwebBin = os.Getenv("SOCIALWEB_TEST_BIN")
	if socialwebBin == "" && os.Geteuid() == 0 && !testing.Short() {
		dir, err := os.MkdirTemp("", "socialweb-nodehost-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer os.RemoveAll(dir)
		socialwebBin = filepath.Join(dir, "socialweb")
		build := exec.Command("go", "build", "-o", socialwebBin, "socialweb.computer/cmd/socialweb")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "building socialweb:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.Exit(code)
}

type rig struct {
	t            *testing.T
	env          *testenv.Env
	c            client.Client
	tenants      *tenant.Manager
	cluster      *v1alpha1.Cluster
	tc           kubernetes.Interface
	nodeHost     nodehost.Options
	stopNodeHost func()
}

// run starts a manager with what setup registers until the test ends (or the returned stop).
func (r *rig) run(setup func(crmanager.Manager) error) (stop func()) {
	r.t.Helper()
	m, err := ctrlmanager.New(r.env.Config, ctrlmanager.Options{SkipNameValidation: true, Logger: quiet()})
	if err != nil {
		r.t.Fatal(err)
	}
	if err := setup(m); err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = m.Start(ctx) }()
	stop = func() { cancel(); <-stopped }
	r.t.Cleanup(stop)
	return stop
}

// restartNodeHost stops the node host and starts a new one: its memory is gone.
func (r *rig) restartNodeHost() {
	r.t.Helper()
	r.stopNodeHost()
	r.stopNodeHost = r.run(func(m crmanager.Manager) error { return nodehost.Setup(m, r.nodeHost) })
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newRig starts the core, a tenant.Manager, the Cluster controller and the node host, and a
// Cluster (running) with the given spec, and waits until it is Ready.
func newRig(t *testing.T, spec v1alpha1.ClusterSpec, o nodehost.Options) *rig {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("the node host suites need root (the tenant network namespace and veth pair)")
		}
		t.Skip("the node host suites need root (the tenant network namespace and veth pair)")
	}
	if socialwebBin == "" {
		t.Skip("no socialweb binary to run tenant control planes (-short, or not root)")
	}
	ip, err := tenant.EnsureAdvertiseAddress()
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.Start(t, testenv.Options{})
	tenants, err := tenant.NewManager(tenant.Config{Root: filepath.Join(t.TempDir(), "tenants"), Binary: socialwebBin, Advertise: ip, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tenants.Shutdown)
	r := &rig{t: t, env: env, c: env.Client, tenants: tenants}
	r.run(func(m crmanager.Manager) error { return cluster.Setup(m, nil, tenants, "") })
	o.Tenants, o.Log = tenants, quiet()
	r.nodeHost = o
	r.stopNodeHost = r.run(func(m crmanager.Manager) error { return nodehost.Setup(m, r.nodeHost) })

	spec.Account, spec.Name, spec.Running = owner, "c1", true
	cl := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"}, Spec: spec}
	if err := env.Client.Create(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	r.cluster = cl
	r.eventually(90*time.Second, "Cluster Ready", func() (bool, string) {
		r.get()
		return r.cluster.Status.Phase == v1alpha1.ClusterReady, string(r.cluster.Status.Phase)
	})
	cfg, err := tenants.AdminConfig(tenant.Key{Namespace: ns, Name: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.tc, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) get() {
	r.t.Helper()
	var c v1alpha1.Cluster
	if err := r.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "c1"}, &c); err != nil {
		r.t.Fatal(err)
	}
	r.cluster = &c
}

func (r *rig) eventually(timeout time.Duration, what string, f func() (bool, string)) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, detail := f()
		if ok {
			return
		}
		last = detail
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
}

// claims lists the Cluster's NodeClaims.
func (r *rig) claims() []v1alpha1.NodeClaim {
	r.t.Helper()
	var l v1alpha1.NodeClaimList
	if err := r.c.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		r.t.Fatal(err)
	}
	return l.Items
}

func (r *rig) waitClaims(n int, timeout time.Duration) []v1alpha1.NodeClaim {
	r.t.Helper()
	var got []v1alpha1.NodeClaim
	r.eventually(timeout, fmt.Sprintf("%d NodeClaims", n), func() (bool, string) {
		got = r.claims()
		return len(got) == n, fmt.Sprintf("%d claims", len(got))
	})
	return got
}

// stayClaims checks the claim count stays n for d.
func (r *rig) stayClaims(n int, d time.Duration) {
	r.t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if got := r.claims(); len(got) != n {
			r.t.Fatalf("%d NodeClaims, want %d to stay: %v", len(got), n, names(got))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func names(cs []v1alpha1.NodeClaim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name+"/"+c.Spec.NodeName)
	}
	return out
}

// pod creates a pod in the tenant's default namespace; no node can run it yet.
func (r *rig) pod(name string) {
	r.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}}}}
	if _, err := r.tc.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// podRequesting creates a pod asking for cpu and memory.
func (r *rig) podRequesting(name, cpu, mem string) {
	r.t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(mem)}}}}}}
	if _, err := r.tc.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// unschedulable waits until the scheduler marked the pod Unschedulable and returns since when.
func (r *rig) unschedulable(name string) time.Time {
	r.t.Helper()
	var since time.Time
	r.eventually(30*time.Second, "pod "+name+" Unschedulable", func() (bool, string) {
		p, err := r.tc.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable {
				since = c.LastTransitionTime.Time
				return true, ""
			}
		}
		return false, fmt.Sprintf("%v", p.Status.Conditions)
	})
	return since
}

func (r *rig) deletePod(name string) {
	r.t.Helper()
	zero := int64(0)
	if err := r.tc.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		r.t.Fatal(err)
	}
}

// readyNode registers a Node in the tenant with room for one pod and condition Ready True,
// as a kubelet would.
func (r *rig) readyNode(name string) { r.readyNodeAt(name, "10.77.0.2", false) }

// readyNodeAt is readyNode with InternalIP ip, and when closed with the taint a claimed
// node's kubelet registers with (v1alpha1.TaintNodeUnregistered).
func (r *rig) readyNodeAt(name, ip string, closed bool) {
	r.t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if closed {
		n.Spec.Taints = []corev1.Taint{{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule}}
	}
	if _, err := r.tc.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	room := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("1"),
		corev1.ResourceMemory: resource.MustParse("1Gi")}
	// The node lifecycle controller writes the new node too (its taints): read, set, retry.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := r.tc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Capacity, n.Status.Allocatable = room, room
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		_, err = r.tc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) scaling() *metav1.Condition {
	r.get()
	return meta.FindStatusCondition(r.cluster.Status.Conditions, string(v1alpha1.ConditionScaling))
}

func (r *rig) waitScaling(reason string) {
	r.t.Helper()
	r.eventually(30*time.Second, "Scaling reason "+reason, func() (bool, string) {
		c := r.scaling()
		return c != nil && c.Reason == reason, fmt.Sprintf("%+v", c)
	})
}

var nodeName = regexp.MustCompile(`^node-[0-9a-f]{10}$`)

// A pending pod in a zero-node cluster makes exactly one NodeClaim, once the batch closed
// (1 s after the pod became Unschedulable), naming the Cluster, a generated node and the
// owner; the decision then holds (the claim's capacity fits the pod).
func TestNodeHost_PendingPodClaimsOneNode(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 3, PodsPerNode: 16, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	if got := r.claims(); len(got) != 0 {
		t.Fatalf("claims of a cluster without pods: %v", names(got))
	}
	r.pod("waits")
	since := r.unschedulable("waits")
	got := r.waitClaims(1, 30*time.Second)
	c := got[0]
	if !nodeName.MatchString(c.Spec.NodeName) || c.Name != "c1-"+c.Spec.NodeName || c.Spec.ClusterRef.Name != "c1" ||
		c.Spec.OwnerDid != owner || c.Labels[v1alpha1.LabelInfraCluster] != "c1" {
		t.Errorf("claim %s: spec %+v labels %v", c.Name, c.Spec, c.Labels)
	}
	// Both times are whole seconds; the batch closes BatchIdle (1 s) after the pod's.
	if wait := c.CreationTimestamp.Sub(since); wait < time.Second {
		t.Errorf("claim created %s after the pod became Unschedulable; the batch is 1 s", wait)
	}
	// A pod that asks for nothing: a node of the smallest size.
	if c.Spec.CPUs != 1 || c.Spec.MemMiB != 256 {
		t.Errorf("claim size %d CPU %d MiB, want the smallest of the default range, 1 CPU 256 MiB", c.Spec.CPUs, c.Spec.MemMiB)
	}
	// Simulated before any node joined: the claim in flight holds the pod.
	r.waitScaling(nodehost.ConditionReason(scale.ReasonFitsExisting))
	r.stayClaims(1, 3*time.Second)
	if c := r.scaling(); c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "1 pending pod(s)") {
		t.Errorf("Scaling %+v", c)
	}
}

// Each node is rented at the smallest size of the cluster's range that holds the pods it is
// for, before any node has joined: a 1.5-CPU, 600 MiB pod gets a 2-CPU, 768 MiB node; a pod
// larger than the largest size gets none and is named on the Scaling condition.
func TestNodeHost_NodesAreSizedToTheirPods(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 3, PodsPerNode: 16, ScaleHold: metav1.Duration{Duration: time.Minute},
		NodeSize: &v1alpha1.NodeSizeRange{MaxCPUs: 2, MaxMemMiB: 2048}}, nodehost.Options{})
	r.podRequesting("web", "1500m", "600Mi")
	r.podRequesting("huge", "3", "100Mi")
	r.unschedulable("web")
	r.unschedulable("huge")
	c := r.waitClaims(1, 30*time.Second)[0]
	if c.Spec.CPUs != 2 || c.Spec.MemMiB != 768 {
		t.Errorf("claim size %d CPU %d MiB, want 2 CPU 768 MiB", c.Spec.CPUs, c.Spec.MemMiB)
	}
	r.stayClaims(1, 3*time.Second)
	if sc := r.scaling(); !strings.Contains(sc.Message, "default/huge: Insufficient cpu") {
		t.Errorf("Scaling message %q does not name the pod no node can run", sc.Message)
	}
	// The pod says why too, once however many decisions repeat it.
	var evs []corev1.Event
	r.eventually(10*time.Second, "a NotTriggerScaleUp Event on default/huge", func() (bool, string) {
		list, err := r.tc.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=huge"})
		if err != nil {
			return false, err.Error()
		}
		evs = nil
		for _, e := range list.Items {
			if e.Source.Component == nodehost.EventComponent {
				evs = append(evs, e)
			}
		}
		return len(evs) > 0, fmt.Sprintf("%d events of the node host's among %d", len(evs), len(list.Items))
	})
	r.stayClaims(1, 3*time.Second) // more decisions
	list, err := r.tc.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=huge,source=" + nodehost.EventComponent})
	if err != nil {
		t.Fatal(err)
	}
	evs = list.Items
	e := evs[0]
	if len(evs) != 1 || e.Reason != nodehost.ReasonNotTriggerScaleUp || e.Type != corev1.EventTypeWarning || e.Count > 1 ||
		!strings.Contains(e.Message, "Insufficient cpu") || e.Source.Component != nodehost.EventComponent {
		t.Errorf("events on huge: %d, first %s %s x%d from %s: %q", len(evs), e.Type, e.Reason, e.Count, e.Source.Component, e.Message)
	}
}

// Two pods that need a node each (podsPerNode 1) make two claims, and no more.
func TestNodeHost_TwoPodsTwoClaims(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	r.pod("a")
	r.pod("b")
	r.unschedulable("a")
	r.unschedulable("b")
	got := r.waitClaims(2, 30*time.Second)
	if got[0].Spec.NodeName == got[1].Spec.NodeName {
		t.Errorf("two claims for one node name: %v", names(got))
	}
	r.stayClaims(2, 3*time.Second)
}

// maxNodes bounds the claims: three pods needing a node each, maxNodes 2, two claims, and
// the Cluster says it is at maxNodes.
func TestNodeHost_MaxNodesBoundsClaims(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 2, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	for _, p := range []string{"a", "b", "c"} {
		r.pod(p)
	}
	for _, p := range []string{"a", "b", "c"} {
		r.unschedulable(p)
	}
	r.waitClaims(2, 30*time.Second)
	r.waitScaling(nodehost.ConditionReason("at maxNodes"))
	r.stayClaims(2, 3*time.Second)
}

// A pending pod deleted before its batch closes makes no claim. The batch is widened to 5 s
// so the test can delete the pod inside it.
func TestNodeHost_PodDeletedWithinBatchClaimsNothing(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 3, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}},
		nodehost.Options{BatchIdle: 5 * time.Second, BatchMax: 10 * time.Second})
	r.pod("gone")
	since := r.unschedulable("gone")
	r.waitScaling(nodehost.ConditionReason("batching pending pods"))
	r.deletePod("gone")
	if left := time.Until(since.Add(5 * time.Second)); left < time.Second {
		t.Fatalf("the pod was deleted only %s before its batch closed; too late to show anything", left)
	}
	r.waitScaling(nodehost.ConditionReason("no intent and no node"))
	r.stayClaims(0, 7*time.Second)
}

// Partial scale-in with driven nodes: two pods, two claims; the test registers both nodes
// Ready (room for one pod each), the scheduler binds a pod to each; status.nodes reads 2.
// Deleting one pod empties its node: after scaleHold (3 s) that node is cordoned and its
// claim deleted, the other node and claim are untouched, status.nodes reads 1.
func TestNodeHost_DrivenNodes_EmptyPastHoldReleasesOne(t *testing.T) {
	hold := 3 * time.Second
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: hold}}, nodehost.Options{})
	r.pod("a")
	r.pod("b")
	r.unschedulable("a")
	r.unschedulable("b")
	claims := r.waitClaims(2, 30*time.Second)
	for _, c := range claims {
		r.readyNode(c.Spec.NodeName)
	}
	bound := map[string]string{}
	r.eventually(30*time.Second, "both pods bound", func() (bool, string) {
		for _, p := range []string{"a", "b"} {
			got, err := r.tc.CoreV1().Pods("default").Get(context.Background(), p, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			bound[p] = got.Spec.NodeName
		}
		return bound["a"] != "" && bound["b"] != "" && bound["a"] != bound["b"], fmt.Sprint(bound)
	})
	r.eventually(30*time.Second, "status.nodes 2", func() (bool, string) {
		r.get()
		return r.cluster.Status.Nodes == 2, fmt.Sprint(r.cluster.Status.Nodes)
	})
	r.waitScaling(nodehost.ConditionReason("every node busy"))

	keep, drop := bound["a"], bound["b"]
	var kept v1alpha1.NodeClaim
	for _, c := range claims {
		if c.Spec.NodeName == keep {
			kept = c
		}
	}
	r.deletePod("b")
	emptied := time.Now()
	left := r.waitClaims(1, 30*time.Second)
	if waited := time.Since(emptied); waited < hold {
		t.Errorf("the claim of the emptied node went after %s, within the hold of %s", waited, hold)
	}
	if left[0].UID != kept.UID || left[0].Spec.NodeName != keep {
		t.Errorf("left %v, want the claim of %s (uid %s)", names(left), keep, kept.UID)
	}
	for n, want := range map[string]bool{drop: true, keep: false} {
		got, err := r.tc.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
		if n == drop && apierrors.IsNotFound(err) {
			// No NodeClaim controller runs here, so the claim went at once, and its Node,
			// labelled as the claim's, was then removed as a ghost (ghosts.go).
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.Unschedulable != want {
			t.Errorf("node %s unschedulable %v, want %v", n, got.Spec.Unschedulable, want)
		}
	}
	r.eventually(30*time.Second, "status.nodes 1", func() (bool, string) {
		r.get()
		return r.cluster.Status.Nodes == 1, fmt.Sprint(r.cluster.Status.Nodes)
	})
	r.stayClaims(1, 2*time.Second)
}

// spec.running false deletes every claim of the Cluster, and the Cluster says why.
func TestNodeHost_RunningFalseReleasesEveryClaim(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	r.pod("a")
	r.pod("b")
	r.unschedulable("a")
	r.unschedulable("b")
	claims := r.waitClaims(2, 30*time.Second)
	r.readyNode(claims[0].Spec.NodeName)
	r.eventually(30*time.Second, "status.nodes 1", func() (bool, string) {
		r.get()
		return r.cluster.Status.Nodes == 1, fmt.Sprint(r.cluster.Status.Nodes)
	})
	if err := r.c.Patch(context.Background(), r.cluster, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"running":false}}`))); err != nil {
		t.Fatal(err)
	}
	r.waitClaims(0, 30*time.Second)
	r.waitScaling(nodehost.ReasonStopped)
	r.get()
	if r.cluster.Status.Nodes != 0 {
		t.Errorf("status.nodes %d after every claim went", r.cluster.Status.Nodes)
	}
	r.stayClaims(0, 2*time.Second)
	for _, c := range claims {
		var got v1alpha1.NodeClaim
		if err := r.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: c.Name}, &got); !apierrors.IsNotFound(err) {
			t.Errorf("claim %s: %v", c.Name, err)
		}
	}
}

// Deleting the Cluster deletes every claim (its control plane and store go with the Cluster
// controller's teardown), and the Cluster goes; a claim made afterwards naming it is deleted.
func TestNodeHost_ClusterDeleteReleasesEveryClaim(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	r.pod("a")
	r.pod("b")
	r.unschedulable("a")
	r.unschedulable("b")
	r.waitClaims(2, 30*time.Second)
	if err := r.c.Delete(context.Background(), r.cluster); err != nil {
		t.Fatal(err)
	}
	r.waitClaims(0, 30*time.Second)
	r.eventually(60*time.Second, "Cluster gone", func() (bool, string) {
		var c v1alpha1.Cluster
		err := r.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "c1"}, &c)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	r.stayClaims(0, 2*time.Second)
	// A claim naming a Cluster that does not exist has no cluster to join: it is deleted.
	stray := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stray"},
		Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "c1"}, NodeName: "node-stray", OwnerDid: owner}}
	if err := r.c.Create(context.Background(), stray); err != nil {
		t.Fatal(err)
	}
	r.waitClaims(0, 30*time.Second)
}

// A claim that Failed will never give its node: after the retry delay (2 s here), during
// which it holds its place, the node host deletes it, and the pod that still waits claims a
// node again, under a new node name. When that one fails too, it holds its place twice as
// long: a market that fails every claim is asked less and less often.
// A node that joins with the InternalIP of another node of its cluster (the first link of
// two hosts) is never opened: its claim is deleted, the Node says why, and the pod it came
// for gets a node of a new claim.
func TestNodeHost_NodeWithAnotherNodesAddressIsReplaced(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 2, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	r.pod("a")
	r.unschedulable("a")
	first := r.waitClaims(1, 30*time.Second)[0]
	r.readyNodeAt(first.Spec.NodeName, "10.78.0.2", false)
	r.pod("b") // one pod per node: b needs a second
	r.unschedulable("b")
	var second v1alpha1.NodeClaim
	r.eventually(30*time.Second, "a second claim", func() (bool, string) {
		for _, c := range r.claims() {
			if c.UID != first.UID {
				second = c
			}
		}
		return second.UID != "", fmt.Sprint(names(r.claims()))
	})
	r.readyNodeAt(second.Spec.NodeName, "10.78.0.2", true)
	ctx := context.Background()
	r.eventually(30*time.Second, "the second claim replaced", func() (bool, string) {
		// Until its claim's release removes it (here at once: no NodeClaim controller runs,
		// and the node host then removes the Node as a ghost), the node stays closed.
		if n, err := r.tc.CoreV1().Nodes().Get(ctx, second.Spec.NodeName, metav1.GetOptions{}); err == nil &&
			!slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == v1alpha1.TaintNodeUnregistered }) {
			t.Fatalf("the node with another's address was opened: taints %v", n.Spec.Taints)
		}
		gone, replaced := true, false
		for _, c := range r.claims() {
			switch {
			case c.UID == second.UID:
				gone = c.DeletionTimestamp != nil
			case c.UID != first.UID:
				replaced = c.Spec.NodeName != second.Spec.NodeName
			}
		}
		return gone && replaced, fmt.Sprint(names(r.claims()))
	})
	r.eventually(30*time.Second, "the node's event", func() (bool, string) {
		evs, err := r.tc.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + second.Spec.NodeName})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.Reason == nodehost.ReasonNodeAddressShared && strings.Contains(e.Message, "10.78.0.2") && strings.Contains(e.Message, first.Spec.NodeName) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(evs.Items))
	})
}

func TestNodeHost_FailedClaimIsReplaced(t *testing.T) {
	retry := 2 * time.Second
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 2, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}},
		nodehost.Options{EndedRetry: retry})
	r.pod("a")
	r.unschedulable("a")
	claim := r.waitClaims(1, 30*time.Second)[0]
	for round, hold := range []time.Duration{retry, 2 * retry} {
		claim.Status.Phase = v1alpha1.NodeClaimFailed
		claim.Status.Message = "set by the test"
		if err := r.c.Status().Update(context.Background(), &claim); err != nil {
			t.Fatal(err)
		}
		failed := time.Now()
		// It holds its place through the retry delay: no second claim although maxNodes is 2.
		r.stayClaims(1, hold*3/4)
		if got := r.claims(); got[0].UID != claim.UID {
			t.Fatalf("round %d: the failed claim was replaced within the retry delay: %v", round, names(got))
		}
		var next v1alpha1.NodeClaim
		r.eventually(30*time.Second, "a new claim in place of the failed one", func() (bool, string) {
			got := r.claims()
			if len(got) == 1 {
				next = got[0]
			}
			return len(got) == 1 && got[0].UID != claim.UID && got[0].Spec.NodeName != claim.Spec.NodeName, fmt.Sprint(names(got))
		})
		if waited := time.Since(failed); waited < hold {
			t.Errorf("round %d: replaced %s after it failed, within the retry delay of %s", round, waited, hold)
		}
		claim = next
	}
	r.stayClaims(1, 2*time.Second)
}

// What a restart of the node host costs: the only memory, when each node was first seen
// empty, is gone, so an empty node's hold starts again. The claim of a node that was empty
// for most of its hold goes a whole hold after the restart.
func TestNodeHost_DrivenNodes_RestartRestartsTheHold(t *testing.T) {
	hold := 4 * time.Second
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 2, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: hold}}, nodehost.Options{})
	r.pod("a")
	r.unschedulable("a")
	claim := r.waitClaims(1, 30*time.Second)[0]
	r.deletePod("a")
	r.readyNode(claim.Spec.NodeName)
	r.eventually(30*time.Second, "node seen Ready and empty", func() (bool, string) {
		c := r.scaling()
		return c != nil && c.Reason == nodehost.ConditionReason("empty within hold"), fmt.Sprintf("%+v", c)
	})
	time.Sleep(hold * 3 / 4)
	if got := r.claims(); len(got) != 1 {
		t.Fatalf("claims within the hold: %v", names(got))
	}
	r.restartNodeHost()
	restarted := time.Now()
	r.waitClaims(0, 30*time.Second)
	if waited := time.Since(restarted); waited < hold {
		t.Errorf("the claim went %s after the restart; a restarted node host starts the hold of %s again", waited, hold)
	}
}

// A pod that requests more than any node of the cluster offers (64 CPUs, nodes of 1), and
// one whose node selector no node has, rent nothing once a node has joined and shown what
// nodes are: the Scaling condition names them with the scheduler's reason (the simulation
// ran), and a pod that fits still gets its node. Without the rule every settled node that refused it
// would be one more rented, up to maxNodes, and kept.
func TestNodeHost_PodLargerThanANodeRentsNothing(t *testing.T) {
	r := newRig(t, v1alpha1.ClusterSpec{MaxNodes: 4, PodsPerNode: 1, ScaleHold: metav1.Duration{Duration: time.Minute}}, nodehost.Options{})
	r.pod("a")
	r.unschedulable("a")
	r.readyNode(r.waitClaims(1, 30*time.Second)[0].Spec.NodeName)
	r.eventually(30*time.Second, "a bound", func() (bool, string) {
		got, err := r.tc.CoreV1().Pods("default").Get(context.Background(), "a", metav1.GetOptions{})
		return err == nil && got.Spec.NodeName != "", fmt.Sprint(err)
	})
	huge := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "huge"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64")}}}}}}
	if _, err := r.tc.CoreV1().Pods("default").Create(context.Background(), huge, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.unschedulable("huge")
	// And one whose node selector no node of the cluster has.
	ssd := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ssd"},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"disktype": "ssd"}, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}}}}
	if _, err := r.tc.CoreV1().Pods("default").Create(context.Background(), ssd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.unschedulable("ssd")
	r.eventually(30*time.Second, "Scaling names the pods that fit no node", func() (bool, string) {
		c := r.scaling()
		return c != nil && strings.Contains(c.Message, "2 pod(s) no new node can run") && strings.Contains(c.Message, "default/huge: Insufficient cpu") &&
			strings.Contains(c.Message, "default/ssd: node(s) didn't match Pod's node affinity/selector"), fmt.Sprintf("%+v", c)
	})
	// Past the batch and the node's settle time: still one claim.
	r.stayClaims(1, scale.BatchMax+scale.SchedulerSettle)
	// A pod that fits gets a node of its own (the only node holds one pod).
	r.pod("b")
	r.unschedulable("b")
	r.waitClaims(2, 30*time.Second)
}
