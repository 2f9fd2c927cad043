package computecontract

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/repos"
)

// Ready reasons of a step that failed.
const (
	// ReasonRecordRejected: the PDS refused a record the step wrote (the lexicon's limits, the
	// record's size). Writing it again changes nothing; a spec change reconciles again.
	ReasonRecordRejected = "RecordRejected"
	// ReasonStepFailed: a step failed in a way that may pass (the PDS unreachable, an API
	// error); it is retried with the controller's backoff.
	ReasonStepFailed = "StepFailed"
)

// stepFailure is what a reconcile records when the step of stage failed with err, and
// whether err goes back to the queue for a retry. Every failure after admission is reported
// on the object, never only in the log. A nil decision leaves the status alone: a conflict is
// read again (reconcilekit.Settle) and says nothing about the contract.
func stepFailure(stage market.Stage, stored v1alpha1.ComputeContractPhase, err error) (*market.Decision, bool) {
	if err == nil || apierrors.IsConflict(err) {
		return nil, true
	}
	// The phase stays where the contract stands: an unpublished one has asked nothing yet.
	phase := stored
	if stage == market.StageUnpublished || phase == "" {
		phase = v1alpha1.ComputeContractPending
	}
	if errors.Is(err, repos.ErrInvalidRecord) {
		return &market.Decision{Phase: phase, Reason: ReasonRecordRejected, Message: "the PDS refused a record: " + err.Error()}, false
	}
	return &market.Decision{Phase: phase, Reason: ReasonStepFailed, Message: err.Error() + " (retrying)"}, true
}
