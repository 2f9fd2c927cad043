package infra

import (
	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// StalledContract is a declared contract whose ComputeContract cannot move on by itself: its
// Ready condition is False for a reason of its own (InvalidPayload, RecordRejected,
// SecretUnavailable, StepFailed, ...) rather than its phase.
type StalledContract struct {
	Contract string
	Reason   string
	Message  string
}

// Stalled lists, in the order of statuses, the contracts whose ComputeContract (among
// existing) stalls: not finished, Ready False with a reason other than its phase. A
// ComputeContract writes its phase as the reason while it progresses and a reason of its own
// when it waits on something only a person can fix or retries a failure, so the deployment
// says why it does not progress instead of only Deploying.
func Stalled(statuses []v1alpha1.InfraContractStatus, existing []ExistingContract) []StalledContract {
	byName := map[string]*ExistingContract{}
	for i := range existing {
		byName[existing[i].Name] = &existing[i]
	}
	var out []StalledContract
	for _, st := range statuses {
		cc := byName[st.ComputeContract]
		if st.ComputeContract == "" || cc == nil {
			continue
		}
		switch cc.Status.Phase {
		case v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractReleased, v1alpha1.ComputeContractFailed:
			continue
		}
		c := meta.FindStatusCondition(cc.Status.Conditions, string(v1alpha1.ConditionReady))
		if c == nil || c.Status != "False" || c.Reason == "" || c.Reason == string(cc.Status.Phase) {
			continue
		}
		out = append(out, StalledContract{Contract: st.Name, Reason: c.Reason, Message: c.Message})
	}
	return out
}
