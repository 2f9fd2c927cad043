package nodehost

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	listersv1 "k8s.io/client-go/listers/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// pdbRefusal is the error the API server's eviction subresource answers when a
// PodDisruptionBudget allows no disruption (pkg/registry/core/pod/storage/eviction.go).
func pdbRefusal() error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
		Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget web needs 2 healthy pods and has 2 currently"})
	return err
}

// A drain whose eviction a PodDisruptionBudget refuses says which pod and why, in the words
// the Scaling condition carries, and records one Warning Event DisruptionBlocked on the pod
// however often it asks again; an eviction that goes through is not named.
func TestDrainSaysWhyAnEvictionIsRefused(t *testing.T) {
	running := func(p *corev1.Pod) { p.Spec.NodeName = "n2"; p.Status.Phase = corev1.PodRunning }
	web := pod("web-0", all(running, ownedBy("ReplicaSet")))
	other := pod("cache-0", all(running, ownedBy("ReplicaSet")))
	cs := fake.NewClientset(node("n2", corev1.ConditionTrue), web, other)
	refuse := true
	cs.PrependReactor("create", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := a.(clienttesting.CreateAction).GetObject().(*policyv1.Eviction)
		if ev.Name == "web-0" && refuse {
			return true, nil, pdbRefusal()
		}
		return true, nil, nil
	})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, p := range []*corev1.Pod{web, other} {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	rec := record.NewFakeRecorder(10)
	w := &tenantWatch{client: cs, events: rec, pods: listersv1.NewPodLister(idx)}

	for range 2 {
		got, err := drain(context.Background(), w, "n2")
		if err != nil {
			t.Fatal(err)
		}
		want := "2 pod(s) to move; eviction refused: default/web-0: Cannot evict pod as it would violate the pod's disruption budget. " +
			"(The disruption budget web needs 2 healthy pods and has 2 currently)"
		if got.String() != want {
			t.Errorf("drained:\n got %q\nwant %q", got, want)
		}
	}
	n, err := cs.CoreV1().Nodes().Get(context.Background(), "n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !nodeDraining(n) {
		t.Errorf("node not cordoned and marked draining: %+v", n)
	}
	if len(rec.Events) != 1 {
		t.Fatalf("%d events, want 1 (the refusal, once)", len(rec.Events))
	}
	if e := <-rec.Events; !strings.HasPrefix(e, "Warning DisruptionBlocked eviction to consolidate node n2 refused: Cannot evict pod") {
		t.Errorf("event %q", e)
	}

	refuse = false
	got, err := drain(context.Background(), w, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if got.String() != "2 pod(s) to move" {
		t.Errorf("once the budget allows it: %q", got)
	}
}

func TestDrainedString(t *testing.T) {
	d := drained{left: 5, refused: []string{"a/1: x", "a/2: x", "a/3: x", "a/4: x"}}
	if got, want := d.String(), "5 pod(s) to move; eviction refused: a/1: x; a/2: x; a/3: x; and 1 more"; got != want {
		t.Errorf("got %q want %q", got, want)
	}
}
