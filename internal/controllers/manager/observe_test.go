package manager

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func TestObserved(t *testing.T) {
	failing := reconcile.Func(func(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
		return reconcile.Result{}, errors.Join(errors.New("writing status"), ctx.Err())
	})
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}}

	var heard []string
	r := Observed("c", failing, func(controller string, got reconcile.Request, _ time.Time) {
		heard = append(heard, controller+"/"+got.Name)
	})
	live, cancel := context.WithCancel(context.Background())
	if _, err := r.Reconcile(live, req); err == nil {
		t.Fatal("an error of a running manager was dropped")
	}
	cancel()
	if _, err := r.Reconcile(live, req); err != nil {
		t.Fatalf("an error after the manager stopped was reported: %v", err)
	}
	if len(heard) != 2 || heard[0] != "c/a" {
		t.Fatalf("observer heard %v, want two reconciles of c/a", heard)
	}
	if _, err := Observed("c", failing, nil).Reconcile(context.Background(), req); err == nil {
		t.Fatal("without an observer, an error of a running manager was dropped")
	}
}
