package netpol

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"socialweb.computer/internal/netpol/podgate"
)

func withUID(uid string) podOpt { return func(p *corev1.Pod) { p.UID = types.UID(uid) } }

// Addresses the node's CNI assigned stand in for a pod of this node whose status does not
// show them yet, or shows an older sandbox's; not for another node's pod.
func TestDecideWithLearntAddresses(t *testing.T) {
	denyEgress := policy("default", "deny", map[string]string{"app": "x"}, func(s *networkingv1.NetworkPolicySpec) {
		s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	})
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		learnt map[types.UID][]netip.Addr
		want   []netip.Addr // the isolated pod's addresses; nil: not decided at all
	}{
		{"no status address, nothing learnt: not yet decided", pod("default", "p", self, "", map[string]string{"app": "x"}, withUID("u1")), nil, nil},
		{"no status address, learnt", pod("default", "p", self, "", map[string]string{"app": "x"}, withUID("u1")),
			map[types.UID][]netip.Addr{"u1": addrs("10.42.0.7")}, addrs("10.42.0.7")},
		{"a new sandbox's address wins over the status's", pod("default", "p", self, "10.42.0.5", map[string]string{"app": "x"}, withUID("u1")),
			map[types.UID][]netip.Addr{"u1": addrs("10.42.0.9")}, addrs("10.42.0.9")},
		{"learnt for another pod: the status's", pod("default", "p", self, "10.42.0.5", map[string]string{"app": "x"}, withUID("u1")),
			map[types.UID][]netip.Addr{"u2": addrs("10.42.0.9")}, addrs("10.42.0.5")},
		{"another node's pod: never learnt here", pod("default", "p", "node-b", "", map[string]string{"app": "x"}, withUID("u1")),
			map[types.UID][]netip.Addr{"u1": addrs("10.42.0.9")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(Input{NodeName: self, Policies: []*networkingv1.NetworkPolicy{denyEgress}, Pods: []*corev1.Pod{tc.pod},
				Namespaces: []*corev1.Namespace{namespace("default", nil)}, Learnt: tc.learnt})
			var got []netip.Addr
			for _, p := range d.Pods {
				got = p.IPs
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Fatalf("isolated addresses (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPruneLearnt(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	a := []netip.Addr{netip.MustParseAddr("10.42.0.7")}
	finished := func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }
	pods := []*corev1.Pod{
		pod("default", "caught-up", self, "10.42.0.7", nil, withUID("caught-up")),
		pod("default", "lagging", self, "", nil, withUID("lagging")),
		pod("default", "old-sandbox", self, "10.42.0.5", nil, withUID("old-sandbox")),
		pod("default", "done", self, "", nil, withUID("done"), finished),
	}
	learnt := map[types.UID]learntAddrs{
		"caught-up":   {IPs: a, At: now.Add(-time.Second)},
		"lagging":     {IPs: a, At: now.Add(-time.Hour)}, // kept: the pod is there, its status is not
		"old-sandbox": {IPs: a, At: now.Add(-time.Second)},
		"done":        {IPs: a, At: now},
		"unseen-new":  {IPs: a, At: now.Add(-time.Second)},
		"unseen-old":  {IPs: a, At: now.Add(-learntTTL)},
	}
	got := pruneLearnt(learnt, pods, now)
	want := []types.UID{"caught-up", "done", "unseen-old"}
	if !slices.Equal(got, want) {
		t.Fatalf("pruned %v, want %v", got, want)
	}
}

// The gate on a real unix socket: the plugin's request is answered only after rules whose
// input holds the pod (on this node) were written, and not for requests made after that
// input was read; a bad request is refused at once; a plugin that gives up is forgotten.
func TestGateAnswersOnceTheRulesKnowThePod(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	woken := make(chan struct{}, 16)
	g := newGate(func() { woken <- struct{}{} })
	sock := filepath.Join(t.TempDir(), "gate.sock")
	if err := g.listen(ctx, sock); err != nil {
		t.Fatal(err)
	}
	req := podgate.Request{UID: "u1", Namespace: "default", Name: "p", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.7")}}
	answered := make(chan error, 1)
	go func() { answered <- podgate.Ask(sock, req, 10*time.Second) }()
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the request did not mark the rules dirty")
	}
	learnt, _, seq := g.snapshot()
	if !slices.Equal(learnt["u1"], req.IPs) || seq != 1 {
		t.Fatalf("snapshot %v at %d, want u1's address at 1", learnt, seq)
	}

	// Rules whose input lacks the pod (the informer has not seen it, or not on this node).
	g.release(seq, Input{NodeName: self, Pods: []*corev1.Pod{pod("default", "p", "", "", nil, withUID("u1"))}})
	select {
	case err := <-answered:
		t.Fatalf("answered (%v) before the rules held the pod", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Rules read before the request (seq 0) do not release it either.
	withPod := Input{NodeName: self, Pods: []*corev1.Pod{pod("default", "p", self, "", nil, withUID("u1"))}}
	g.release(0, withPod)
	select {
	case err := <-answered:
		t.Fatalf("answered (%v) for rules read before the request", err)
	case <-time.After(200 * time.Millisecond):
	}
	g.release(seq, withPod)
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("Ask: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not answered once the rules held the pod")
	}

	// A request naming no address is refused, and the plugin does not ask again.
	bad := req
	bad.IPs = nil
	t0 := time.Now()
	if err := podgate.Ask(sock, bad, 10*time.Second); err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("bad request: %v after %v, want a refusal at once", err, time.Since(t0))
	}

	// A plugin that times out leaves no waiter behind.
	if err := podgate.Ask(sock, podgate.Request{UID: "u2", IPs: req.IPs}, 300*time.Millisecond); err == nil {
		t.Fatal("answered without rules")
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.waiting() {
		if time.Now().After(deadline) {
			t.Fatal("a gone plugin's waiter stays")
		}
		time.Sleep(10 * time.Millisecond)
	}

	// With no process on the socket, the plugin fails within its timeout.
	cancel()
	time.Sleep(50 * time.Millisecond)
	if err := podgate.Ask(sock, req, 300*time.Millisecond); err == nil {
		t.Fatal("answered with no process on the socket")
	}
}

// The request's pod is read from the apiserver at once, so the rules need not wait for the
// informer: it joins the decision's pods until the informer shows it, and only when it is
// the request's pod (its UID) and bound to this node.
func TestGateReadsThePod(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		got  *corev1.Pod
		kept bool
	}{
		{"the pod, bound here", pod("default", "p", self, "", map[string]string{"app": "x"}, withUID("u1")), true},
		{"a namesake (another UID)", pod("default", "p", self, "", nil, withUID("u0")), false},
		{"bound elsewhere", pod("default", "p", "node-b", "", nil, withUID("u1")), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			woken := 0
			g := newGate(func() { woken++ })
			g.node = self
			g.get = func(_ context.Context, ns, name string) (*corev1.Pod, error) {
				if ns != "default" || name != "p" {
					t.Errorf("read %s/%s, want default/p", ns, name)
				}
				return tc.got, nil
			}
			req := podgate.Request{UID: "u1", Namespace: "default", Name: "p", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.7")}}
			g.add(req, time.Now())
			g.read(ctx, req)
			_, read, _ := g.snapshot()
			if kept := len(read) == 1; kept != tc.kept || (kept && woken != 2) {
				t.Fatalf("read pods %v (woken %d), want kept=%v", read, woken, tc.kept)
			}
			if !tc.kept {
				return
			}
			other := pod("default", "q", self, "10.42.0.3", nil, withUID("u2"))
			if got := withReadPods([]*corev1.Pod{other}, read); len(got) != 2 || got[1].UID != "u1" {
				t.Fatalf("merged %v, want the informer's pod and the read one", got)
			}
			// Once the informer shows it, the informer tells (its deletion too).
			g.prune([]*corev1.Pod{tc.got}, time.Now())
			if _, read, _ := g.snapshot(); len(read) != 0 {
				t.Fatalf("read pods %v after the informer showed the pod", read)
			}
		})
	}
}

// A pod the informer shows already (its UID) is not read from the apiserver: the informer
// tells. A namesake it shows (another UID) does not stop the read.
func TestGateReadsOnlyWhatTheInformerDoesNotShow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		shownUID types.UID
		reads    int
	}{
		{"shown", "u1", 0},
		{"a namesake shown", "u0", 1},
		{"not shown", "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(func() {})
			g.node = self
			reads := 0
			g.get = func(context.Context, string, string) (*corev1.Pod, error) {
				reads++
				return pod("default", "p", self, "", nil, withUID("u1")), nil
			}
			g.shown = func(ns, name string, uid types.UID) bool {
				return tc.shownUID != "" && ns == "default" && name == "p" && uid == tc.shownUID
			}
			req := podgate.Request{UID: "u1", Namespace: "default", Name: "p", IPs: []netip.Addr{netip.MustParseAddr("10.42.0.7")}}
			g.add(req, time.Now())
			g.read(context.Background(), req)
			if reads != tc.reads {
				t.Fatalf("%d reads from the apiserver, want %d", reads, tc.reads)
			}
		})
	}
}
