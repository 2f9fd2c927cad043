package reconcilekit

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func after(d time.Duration) reconcile.Result { return reconcile.Result{RequeueAfter: d} }

func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []reconcile.Result
		want reconcile.Result
	}{
		{"none", nil, reconcile.Result{}},
		{"no requeue", []reconcile.Result{{}, {}}, reconcile.Result{}},
		{"one asks", []reconcile.Result{{}, after(time.Second)}, after(time.Second)},
		{"smallest wins", []reconcile.Result{after(30 * time.Second), after(time.Second), after(5 * time.Second)}, after(time.Second)},
		{"zero is no requeue, not soonest", []reconcile.Result{after(0), after(2 * time.Second)}, after(2 * time.Second)},
		{"negative ignored", []reconcile.Result{after(-time.Second), after(3 * time.Second)}, after(3 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Merge(tc.in...); got != tc.want {
				t.Fatalf("Merge = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestJoin(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	for _, tc := range []struct {
		name    string
		in      []Step
		want    reconcile.Result
		wantErr []error
	}{
		{"nothing", nil, reconcile.Result{}, nil},
		{"results only", []Step{{Result: after(time.Minute)}, {Result: after(time.Second)}}, after(time.Second), nil},
		{"one error", []Step{{Result: after(time.Second)}, {Err: a}}, after(time.Second), []error{a}},
		{"errors joined", []Step{{Err: a}, {}, {Err: b}}, reconcile.Result{}, []error{a, b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Join(tc.in...)
			if got != tc.want {
				t.Fatalf("Join result = %+v, want %+v", got, tc.want)
			}
			if (err == nil) != (len(tc.wantErr) == 0) {
				t.Fatalf("Join error = %v, want %v", err, tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !errors.Is(err, w) {
					t.Fatalf("Join error %v does not hold %v", err, w)
				}
			}
		})
	}
}

func TestSettle(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "clusters"}, "c", errors.New("stale"))
	other := errors.New("boom")
	for _, tc := range []struct {
		name    string
		err     error
		want    reconcile.Result
		wantErr error
	}{
		{"nil", nil, reconcile.Result{}, nil},
		{"conflict is a quiet requeue", conflict, after(Soon), nil},
		{"wrapped conflict too", errors.Join(errors.New("writing"), conflict), after(Soon), nil},
		{"other errors stay", other, reconcile.Result{}, other},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Settle(context.Background(), tc.err)
			if got != tc.want || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Settle = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestStatusChanged(t *testing.T) {
	base := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c", ResourceVersion: "1"},
		Status: v1alpha1.ClusterStatus{Phase: v1alpha1.ClusterReady, Conditions: []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}}}
	for _, tc := range []struct {
		name   string
		change func(*v1alpha1.Cluster)
		want   bool
	}{
		{"same", func(*v1alpha1.Cluster) {}, false},
		{"metadata only", func(c *v1alpha1.Cluster) { c.ResourceVersion = "2"; c.Finalizers = []string{"f"} }, false},
		{"spec only", func(c *v1alpha1.Cluster) { c.Spec.Running = !c.Spec.Running }, false},
		{"condition dropped", func(c *v1alpha1.Cluster) { c.Status.Conditions = nil }, true},
		{"phase", func(c *v1alpha1.Cluster) { c.Status.Phase = v1alpha1.ClusterDraining }, true},
		{"condition message", func(c *v1alpha1.Cluster) { c.Status.Conditions[0].Message = "x" }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := base.DeepCopy()
			tc.change(obj)
			if got := StatusChanged(base, obj); got != tc.want {
				t.Fatalf("StatusChanged = %v, want %v", got, tc.want)
			}
		})
	}
}
