package computecontract

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/repos"
)

func TestStepFailure(t *testing.T) {
	refused := fmt.Errorf("compute.vm: %w: Invalid com.publicdomainrelay.temp.market.compute.vm record: string length outside specified range: 921602", repos.ErrInvalidRecord)
	down := fmt.Errorf("rfp: %w: connection refused", repos.ErrUnavailable)
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "computecontracts"}, "a", errors.New("changed"))
	for _, tc := range []struct {
		name       string
		stage      market.Stage
		stored     v1alpha1.ComputeContractPhase
		err        error
		wantNil    bool
		wantPhase  v1alpha1.ComputeContractPhase
		wantReason string
		wantRetry  bool
	}{
		{name: "refused payload stays pending, no retry", stage: market.StageUnpublished, err: refused,
			wantPhase: v1alpha1.ComputeContractPending, wantReason: ReasonRecordRejected},
		{name: "refused delete event keeps the phase", stage: market.StageReleasing, stored: v1alpha1.ComputeContractReleasing, err: refused,
			wantPhase: v1alpha1.ComputeContractReleasing, wantReason: ReasonRecordRejected},
		{name: "unreachable PDS is retried and reported", stage: market.StageUnpublished, stored: v1alpha1.ComputeContractPending, err: down,
			wantPhase: v1alpha1.ComputeContractPending, wantReason: ReasonStepFailed, wantRetry: true},
		{name: "failure while bidding keeps Requesting", stage: market.StageBidding, stored: v1alpha1.ComputeContractRequesting, err: down,
			wantPhase: v1alpha1.ComputeContractRequesting, wantReason: ReasonStepFailed, wantRetry: true},
		{name: "a conflict is not reported", stage: market.StageBidding, err: conflict, wantNil: true, wantRetry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, retry := stepFailure(tc.stage, tc.stored, tc.err)
			if retry != tc.wantRetry {
				t.Errorf("retry = %v, want %v", retry, tc.wantRetry)
			}
			if tc.wantNil {
				if d != nil {
					t.Errorf("decision = %+v, want none", d)
				}
				return
			}
			if d == nil {
				t.Fatal("no decision")
			}
			if d.Phase != tc.wantPhase || d.Reason != tc.wantReason || d.Message == "" {
				t.Errorf("decision = %+v, want phase %s reason %s and a message", d, tc.wantPhase, tc.wantReason)
			}
		})
	}
}
