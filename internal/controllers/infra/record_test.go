package infra

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestGuardHolds(t *testing.T) {
	value := []byte(`{"$type":"computer.socialweb.infra","description":"d"}`)
	spec := func(swap string, value []byte) v1alpha1.AtprotoRecordSpec {
		return v1alpha1.AtprotoRecordSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}, Collection: "computer.socialweb.infra", RKey: "d",
			Record: runtime.RawExtension{Raw: value}, SwapCID: swap, CreateOnly: swap == "", DeletionPolicy: v1alpha1.DeletionPolicyRetain}
	}
	child := func(swap, cid string, inSync metav1.ConditionStatus, observed int64) *v1alpha1.AtprotoRecord {
		c := &v1alpha1.AtprotoRecord{Spec: spec(swap, value)}
		c.Generation = 2
		c.Status.CID = cid
		if inSync != "" {
			c.Status.Conditions = []metav1.Condition{{Type: string(v1alpha1.ConditionInSync), Status: inSync, ObservedGeneration: observed}}
		}
		return c
	}
	rows := []struct {
		name  string
		child *v1alpha1.AtprotoRecord
		want  v1alpha1.AtprotoRecordSpec
		holds bool
	}{
		{"create-only child wrote X, want swap X, same value: holds", child("", "X", metav1.ConditionTrue, 2), spec("X", value), true},
		{"same value re-encoded: holds", child("", "X", metav1.ConditionTrue, 2), spec("X", []byte(`{"description":"d","$type":"computer.socialweb.infra"}`)), true},
		{"child saw another cid: update", child("", "Y", metav1.ConditionTrue, 2), spec("X", value), false},
		{"child not in sync (blocked by another record): update", child("", "X", metav1.ConditionFalse, 2), spec("X", value), false},
		{"child status of an older generation: update", child("", "X", metav1.ConditionTrue, 1), spec("X", value), false},
		{"child not synced yet: update", child("", "", "", 0), spec("X", value), false},
		{"new value: update", child("", "X", metav1.ConditionTrue, 2), spec("X", []byte(`{"$type":"computer.socialweb.infra","description":"e"}`)), false},
		{"child already swaps on another cid: update", child("W", "X", metav1.ConditionTrue, 2), spec("X", value), false},
		{"want create-only: nothing to skip here", child("", "X", metav1.ConditionTrue, 2), spec("", value), false},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if got := guardHolds(row.child, row.want); got != row.holds {
				t.Fatalf("guardHolds = %v, want %v", got, row.holds)
			}
		})
	}
}
