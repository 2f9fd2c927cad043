package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/substrate/guestproc"
	"socialweb.computer/internal/substrate/node"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

// A tenant cluster gains a node of the vm flavour: containerd and the kubelet inside a qemu
// microVM booted from the shared root disk, on a tap device in the node's namespace. The
// node registers with the guest's address as its InternalIP and goes Ready, a pod of an
// image carried on its state disk runs to Succeeded, the apiserver reaches the kubelet in
// the guest for the pod's log, a Service answers by name, a NetworkPolicy holds and pods
// reach the internet and not the host (vmNodeNetwork), a pod on a second vm node reaches
// the first's over their overlay (vmNodesOverlay), and Stop leaves no process, namespace or
// disk.
func TestNode_VMFlavour_JoinsTenantClusterAndRunsAPod(t *testing.T) {
	t.Parallel()
	img := vmNodeRow(t)
	const nodeName = "vm-node-a"
	tc := joinableCluster(t, "v1", nodeName, time.Hour)
	writeProbeImage(t, tc.images)
	inet := substratetest.NewInternet(t)
	state := filepath.Join(t.TempDir(), "nodes")
	cfg := node.Config{StateDir: state, Binary: socialwebBin, ImageDir: tc.images, DNSUpstream: "none", EgressDeny: testEgressDeny, EgressAllow: testEgressAllow,
		Flavour: node.FlavourVM, VMImageDir: img, Accelerator: os.Getenv("SOCIALWEB_VM_ACCEL")}
	s, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	substratetest.Cleanup(t, s, state)
	kc := tc.kc

	ctx := context.Background()
	t0 := time.Now()
	st := bootNode(t, s, "v1-a", nodeName, tc.bundle)
	t.Logf("booted in %.2fs: %s at %s, accelerator %s", time.Since(t0).Seconds(), st.Phase, st.Address, st.Accelerator)
	if !strings.HasPrefix(st.Address, "10.79.") {
		t.Errorf("a vm node's address is %q, want its guest's in 10.79.0.0/16", st.Address)
	}
	dump := func() string {
		out, _ := s.Logs(ctx, "v1-a", 40)
		agent, _ := os.ReadFile(filepath.Join(state, "v1-a", "log"))
		return fmt.Sprintf("--- host agent\n%s--- console\n%s", agent, out)
	}

	// Under TCG a node takes tens of seconds to Ready.
	nodeRunsHello(t, nodeJoined{kc: kc, s: s, id: "v1-a", name: nodeName, address: st.Address, booted: t0, dump: dump}, 5*time.Minute)
	// The node's kubelet and containerd are in the guest: the host runs qemu for it, not them.
	if pids := procsWithArg("--hostname-override\x00" + nodeName); len(pids) != 0 {
		t.Errorf("a kubelet of the vm node runs on the host: %v", pids)
	}
	var hostSide struct {
		HostIP string `json:"hostIP"`
	}
	if err := guestproc.ReadJSON(filepath.Join(state, "v1-a", "node.json"), &hostSide); err != nil || hostSide.HostIP == "" {
		t.Fatalf("the node's host side: %+v %v", hostSide, err)
	}
	vmNodeNetwork(t, kc, nodeName, inet, hostSide.HostIP, dump)
	vmNodesOverlay(t, s, tc, dump)

	// A new value over the same state dir (a restarted bidder) finds the machine and stops it.
	s2, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if gs, err := s2.List(ctx); err != nil || len(gs) != 1 || gs[0].Phase != substrate.Running || gs[0].Address != st.Address || gs[0].Accelerator != st.Accelerator {
		t.Fatalf("restarted substrate lists %+v %v", gs, err)
	}
	if out, _ := s2.Logs(ctx, "v1-a", 0); !strings.Contains(string(out), "socialweb-node: disks mounted") {
		t.Errorf("a vm node's logs are not its console:\n%s", out)
	}
	t2 := time.Now()
	if err := s2.Stop(ctx, "v1-a"); err != nil {
		t.Fatal(err)
	}
	t.Logf("stop in %.2fs", time.Since(t2).Seconds())
	if g, _ := s.Status(ctx, "v1-a"); g.Phase != substrate.Stopped {
		t.Errorf("after Stop: %+v", g)
	}
	if pids := substratetest.Procs(state); len(pids) != 0 {
		t.Errorf("processes of the node left (qemu): %v", pids)
	}
	// This node's namespace: other runs on a shared host have nodes of their own.
	if _, err := os.Stat("/run/netns/swnode-" + nodeTag(filepath.Join(state, "v1-a"))); !os.IsNotExist(err) {
		t.Errorf("network namespace of the node left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(state, "v1-a", "work")); !os.IsNotExist(err) {
		t.Errorf("work dir (the state disk) left: %v", err)
	}
	if err := s.Remove(ctx, "v1-a"); err != nil {
		t.Error(err)
	}
}

// vmNodesOverlay boots a second vm node into tc's cluster and checks the overlay between
// the two guests: a pod on the second reaches web, on the first, by its pod IP and through
// its Service. Each guest runs its overlay on a TUN device of its own kernel, and their
// packets cross the host between two node links; the second node is stopped at the end.
func vmNodesOverlay(t *testing.T, s *node.Substrate, tc tenantToJoin, dump func() string) {
	t.Helper()
	const second = "vm-node-b"
	bundle, err := tenant.MintNodeBundle(filepath.Join(tc.dir, "tenants"), tenant.Key{Namespace: tc.cl.Namespace, Name: tc.cl.Name}, second, tc.cl.Status.Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	bootNode(t, s, "v1-b", second, bundle)
	defer func() {
		if err := s.Stop(context.Background(), "v1-b"); err != nil {
			t.Error(err)
		}
		_ = s.Remove(context.Background(), "v1-b")
	}()
	far := strings.Replace(vmProbePod("far", "{}"), "spec:\n", "spec:\n  nodeName: "+second+"\n", 1)
	tkubectl(t, tc.kc, far, "apply", "-f", "-")
	waitPod(t, tc.kc, "far", "Running", second, 5*time.Minute)
	t.Logf("second vm node runs a pod %.2fs after its boot", time.Since(t0).Seconds())
	webIP := tkubectl(t, tc.kc, "", "get", "pod", "web", "-o", "jsonpath={.status.podIP}")
	for _, url := range []string{"http://" + webIP + ":8080/", "http://web.default.svc.cluster.local/"} {
		testenv.Eventually(t, 90*time.Second, "a pod on "+second+" reaches "+url, func() (bool, error) {
			out, err := tkubectlErr(tc.kc, "exec", "far", "--", "/svcprobe", "get", url)
			out = strings.TrimSpace(out)
			return err == nil && out == "200 web-ok", fmt.Errorf("%q %v\n%s", out, err, dump())
		})
	}
	tkubectl(t, tc.kc, "", "delete", "pod", "far", "--wait=false")
}

// vmNetworkObjects: a web server (app=web, its port named http, probed by the node) behind
// a Service, and two probe pods: a client (role=client), which webIngress lets in, and a
// stranger, which it does not.
var vmNetworkObjects = strings.SplitN(netpolPods, "---\napiVersion: v1\nkind: Pod\nmetadata: {name: client", 2)[0] + `---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
` + vmProbePod("client", "{role: client}") + vmProbePod("stranger", "{}")

func vmProbePod(name, labels string) string {
	return `---
apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: default, labels: ` + labels + `}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: ` + probeImage + `, imagePullPolicy: Never, args: [sleep]}
`
}

// vmNodeNetwork checks what the guest kernel's netfilter modules make possible in a vm node:
// a Service reached by its name (the node's DNS server and kube-proxy's rules), a
// NetworkPolicy enforced (the node's nftables rules) while the node's probes still pass, and
// egress (the guest's masquerade and the host's chain for the node's link): the internet
// namespace answers, a listener on the host's end of the node's link does not.
func vmNodeNetwork(t *testing.T, kc, nodeName string, inet *substratetest.Internet, hostIP string, dump func() string) {
	t.Helper()
	tkubectl(t, kc, vmNetworkObjects, "apply", "-f", "-")
	for _, p := range []string{"web", "client", "stranger"} {
		waitPod(t, kc, p, "Running", nodeName, 5*time.Minute)
	}
	pods := func() string {
		out, _ := tkubectlErr(kc, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].image} restarts={.status.containerStatuses[0].restartCount}{"\n"}{end}`)
		return out
	}
	get := func(from, url string) (string, error) {
		out, err := tkubectlErr(kc, "exec", from, "--", "/svcprobe", "get", url)
		return strings.TrimSpace(out), err
	}
	// kubectl exec lands in the container's root: the page web's server wrote at its start,
	// not the guest's own root (a chroot'ed node put it in the initramfs's).
	if out, err := tkubectlErr(kc, "exec", "web", "--", "/bin/busybox", "cat", "/tmp/www/index.html"); err != nil || strings.TrimSpace(out) != "web-ok" {
		t.Errorf("kubectl exec does not land in the container's root: %q %v\n%s", out, err, dump())
	}
	const web = "http://web.default.svc.cluster.local/"
	reaches := func(from string, want bool) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, fmt.Sprintf("%s reaches %s: %v", from, web, want), func() (bool, error) {
			out, err := get(from, web)
			return (err == nil && out == "200 web-ok") == want, fmt.Errorf("%q %v\n%s%s", out, err, pods(), dump())
		})
	}
	reaches("client", true)
	reaches("stranger", true)
	tkubectl(t, kc, webIngress, "apply", "-f", "-")
	reaches("stranger", false)
	reaches("client", true)
	time.Sleep(2 * time.Second)
	if out, err := get("stranger", web); err == nil {
		t.Errorf("stranger reached web, which the policy does not allow: %q\n%s", out, dump())
	}
	if r := tkubectl(t, kc, "", "get", "pod", "web", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); r != "True" {
		t.Errorf("web is Ready=%q under an ingress policy: the node's probes were refused\n%s", r, dump())
	}
	tkubectl(t, kc, "", "delete", "networkpolicy", "web-ingress")
	reaches("stranger", true)

	testenv.Eventually(t, 60*time.Second, "a pod reaches the internet namespace", func() (bool, error) {
		out, err := get("client", "http://"+inet.HTTP+"/")
		return err == nil && out == "200 "+inet.Body, fmt.Errorf("%q %v\n%s", out, err, dump())
	})
	addr, hits := countingListener(t, hostIP+":0")
	if out, err := get("client", "http://"+addr+"/"); err == nil || hits.Load() != 0 {
		t.Errorf("a pod reached the host's end of its node's link (%s): %q %v, %d connections", addr, out, err, hits.Load())
	}
}
