package infra

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
)

func TestReadyConditionNamesStalledContracts(t *testing.T) {
	stalled := []infra.StalledContract{{Contract: "web", Reason: "InvalidPayload", Message: "compute payload: secrets: TooLong"}}
	for _, tc := range []struct {
		name       string
		phase      v1alpha1.InfraPhase
		stalled    []infra.StalledContract
		status     metav1.ConditionStatus
		reason     string
		msgContain string
	}{
		{"deploying", v1alpha1.InfraDeploying, nil, metav1.ConditionFalse, "Deploying", "waiting for contracts"},
		{"stalled", v1alpha1.InfraDeploying, stalled, metav1.ConditionFalse, "InvalidPayload", "contract web: InvalidPayload: compute payload: secrets: TooLong"},
		{"deployed ignores stale notes", v1alpha1.InfraDeployed, stalled, metav1.ConditionTrue, "Deployed", "every requested contract is deployed"},
		{"long messages are cut", v1alpha1.InfraDeploying, []infra.StalledContract{{Contract: "a", Reason: "StepFailed", Message: strings.Repeat("é", 40000)}}, metav1.ConditionFalse, "StepFailed", " ..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := readyCondition(tc.phase, 1, tc.stalled)
			if c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msgContain) {
				t.Errorf("got %s %s %q, want %s %s containing %q", c.Status, c.Reason, c.Message, tc.status, tc.reason, tc.msgContain)
			}
			if len(c.Message) > 32768 {
				t.Errorf("message of %d bytes", len(c.Message))
			}
		})
	}
}
