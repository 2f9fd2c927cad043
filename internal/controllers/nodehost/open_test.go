package nodehost

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
)

func TestNodesToOpen(t *testing.T) {
	closed := func(name string, ready corev1.ConditionStatus) *corev1.Node {
		n := node(name, ready)
		n.Spec.Taints = []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule},
			{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule}}
		return n
	}
	// node() makes a node Ready 3 s before t0.
	for _, tc := range []struct {
		name        string
		now         time.Time
		nodes       []*corev1.Node
		outstanding []Nomination
		want        []string
		recheck     time.Duration
	}{{
		name:  "Ready, closed, nothing outstanding: opened",
		now:   t0,
		nodes: []*corev1.Node{closed("b", corev1.ConditionTrue), closed("a", corev1.ConditionTrue)},
		want:  []string{"a", "b"},
	}, {
		name:        "a nomination to it outstanding: kept closed; one to another node does not hold it",
		now:         t0,
		nodes:       []*corev1.Node{closed("a", corev1.ConditionTrue), closed("b", corev1.ConditionTrue)},
		outstanding: []Nomination{{Pod: "app/x", Node: "a"}},
		want:        []string{"b"},
		recheck:     OpenDeadline - 3*time.Second, // a was Ready 3 s before
	}, {
		name:        "two kept closed: looked at again when the first reaches OpenDeadline",
		now:         t0,
		nodes:       []*corev1.Node{closed("a", corev1.ConditionTrue), readyAt(closed("b", corev1.ConditionTrue), t0.Add(-20*time.Second))},
		outstanding: []Nomination{{Pod: "app/x", Node: "a"}, {Pod: "app/y", Node: "b"}},
		recheck:     OpenDeadline - 20*time.Second,
	}, {
		name:        "outstanding for OpenDeadline since it turned Ready: opened anyway",
		now:         t0.Add(OpenDeadline),
		nodes:       []*corev1.Node{closed("a", corev1.ConditionTrue)},
		outstanding: []Nomination{{Pod: "app/x", Node: "a"}},
		want:        []string{"a"},
	}, {
		name:  "not Ready yet: the scheduler would fail the pods on it, clearing their nominations",
		now:   t0,
		nodes: []*corev1.Node{closed("a", corev1.ConditionFalse), closed("b", "")},
	}, {
		name:  "open already, or never closed by the node host: nothing to do",
		now:   t0,
		nodes: []*corev1.Node{node("a", corev1.ConditionTrue)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			open, recheck := NodesToOpen(tc.now, tc.nodes, tc.outstanding)
			if diff := cmp.Diff(tc.want, open); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
			if recheck != tc.recheck {
				t.Errorf("recheck in %s, want %s", recheck, tc.recheck)
			}
		})
	}
}

// A node the node host has not opened is planned on (its pods nominated there) and its
// free slots still count for the pending pods: the scheduler has not tried it.
func TestClosedNodeIsPlannedOnAndSettling(t *testing.T) {
	n := node("a", corev1.ConditionTrue)
	n.Spec.Taints = []corev1.Taint{{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule}}
	in := InputOf(t0, nil, []*corev1.Node{n}, nil, Settings{}, scale.State{})
	if len(in.Nodes) != 1 || !in.Nodes[0].ReadySince.Equal(t0) {
		t.Errorf("closed node in the input: %+v, want Ready since now (%v)", in.Nodes, t0)
	}
	in = InputOf(t0, nil, []*corev1.Node{node("a", corev1.ConditionTrue)}, nil, Settings{}, scale.State{})
	if len(in.Nodes) != 1 || !in.Nodes[0].ReadySince.Equal(t0.Add(-3*time.Second)) {
		t.Errorf("open node in the input: %+v, want Ready since its condition", in.Nodes)
	}
}

// readyAt sets when n's Ready condition last changed.
func readyAt(n *corev1.Node, at time.Time) *corev1.Node {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].LastTransitionTime = metav1.NewTime(at)
		}
	}
	return n
}

// A node whose opening patch conflicts with a change made meanwhile (a kubelet's status, the
// node host's own labels) or fails is not opened, and open asks for another pass soon: no
// watched change may come to start one. A node gone is no reason to come back.
func TestOpenAsksAgainAfterAConflict(t *testing.T) {
	closed := node("a", corev1.ConditionTrue)
	closed.Spec.Taints = []corev1.Taint{{Key: v1alpha1.TaintNodeUnregistered, Effect: corev1.TaintEffectNoSchedule}}
	for _, tc := range []struct {
		name   string
		answer error
		again  bool
		opened bool
	}{
		{"opened", nil, false, true},
		{"conflict", apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "a", errors.New("changed")), true, false},
		{"failure", apierrors.NewServiceUnavailable("busy"), true, false},
		{"gone", apierrors.NewNotFound(schema.GroupResource{Resource: "nodes"}, "a"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(closed.DeepCopy())
			if tc.answer != nil {
				cs.PrependReactor("patch", "nodes", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.answer
				})
			}
			r := &Reconciler{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			again := r.open(context.Background(), &pass{}, &tenantWatch{client: cs}, []*corev1.Node{closed}, []string{"a"})
			if again != tc.again {
				t.Errorf("again %v, want %v", again, tc.again)
			}
			n, err := cs.CoreV1().Nodes().Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if opened := !unregistered(n); opened != tc.opened {
				t.Errorf("opened %v, want %v: taints %v", opened, tc.opened, n.Spec.Taints)
			}
		})
	}
}
