package infra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

func TestStalled(t *testing.T) {
	cc := func(name string, phase v1alpha1.ComputeContractPhase, status metav1.ConditionStatus, reason, msg string) ExistingContract {
		st := v1alpha1.ComputeContractStatus{Phase: phase}
		if reason != "" {
			st.Conditions = []metav1.Condition{{Type: string(v1alpha1.ConditionReady), Status: status, Reason: reason, Message: msg}}
		}
		return ExistingContract{Name: name, Status: st}
	}
	statuses := []v1alpha1.InfraContractStatus{
		{Name: "payload", ComputeContract: "cc-payload"},
		{Name: "bidding", ComputeContract: "cc-bidding"},
		{Name: "fresh", ComputeContract: "cc-fresh"},
		{Name: "held", ComputeContract: "cc-held"},
		{Name: "failed", ComputeContract: "cc-failed"},
		{Name: "retrying", ComputeContract: "cc-retrying"},
		{Name: "staged"},
		{Name: "gone", ComputeContract: "cc-gone"},
	}
	existing := []ExistingContract{
		cc("cc-payload", v1alpha1.ComputeContractPending, metav1.ConditionFalse, "InvalidPayload", "compute payload: secrets: TooLong"),
		cc("cc-bidding", v1alpha1.ComputeContractRequesting, metav1.ConditionFalse, "Requesting", "1 bid(s)"),
		cc("cc-fresh", "", "", "", ""),
		cc("cc-held", v1alpha1.ComputeContractHeld, metav1.ConditionTrue, "Started", "guest started"),
		cc("cc-failed", v1alpha1.ComputeContractFailed, metav1.ConditionFalse, "NoBids", "no bid"),
		cc("cc-retrying", v1alpha1.ComputeContractRequesting, metav1.ConditionFalse, "StepFailed", "accept: repo unavailable (retrying)"),
	}
	want := []StalledContract{
		{Contract: "payload", Reason: "InvalidPayload", Message: "compute payload: secrets: TooLong"},
		{Contract: "retrying", Reason: "StepFailed", Message: "accept: repo unavailable (retrying)"},
	}
	if diff := cmp.Diff(want, Stalled(statuses, existing)); diff != "" {
		t.Errorf("Stalled (-want +got):\n%s", diff)
	}
}
