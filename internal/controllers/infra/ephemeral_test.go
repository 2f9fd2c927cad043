package infra

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// TestEphemeralEndAfterTheLastContractFinished: the pass that observes the last contract
// finish asks for the next pass at once (its own status write wakes nothing), which ends the
// EphemeralInfra; an ended one that has finished deletes itself; one still running waits.
func TestEphemeralEndAfterTheLastContractFinished(t *testing.T) {
	created := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	now := created.Add(time.Minute)
	eph := func(ended bool, phase v1alpha1.InfraPhase, contracts ...v1alpha1.InfraContractPhase) *object {
		e := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "eph", CreationTimestamp: metav1.NewTime(created)}}
		e.Spec.TTLSeconds = 600
		for i, c := range contracts {
			e.Status.Contracts = append(e.Status.Contracts, v1alpha1.InfraContractStatus{Name: string(rune('a' + i)), Phase: c, ComputeContract: "cc"})
		}
		e.Status.Phase = phase
		if ended {
			at := metav1.NewTime(now)
			e.Status.EndedAt = &at
		}
		return wrap(e)
	}
	for _, tc := range []struct {
		name        string
		obj         *object
		wantRequeue time.Duration
		wantDelete  bool
	}{
		{"the last contract failed in this pass: next pass at once", eph(false, v1alpha1.InfraDegraded, v1alpha1.InfraContractFailed), endNext, false},
		{"the last contract released in this pass: next pass at once", eph(false, v1alpha1.InfraReleased, v1alpha1.InfraContractReleased, v1alpha1.InfraContractStaged), endNext, false},
		{"a contract still deployed: nothing", eph(false, v1alpha1.InfraDeployed, v1alpha1.InfraContractReleased, v1alpha1.InfraContractDeployed), 0, false},
		{"ended and finished: deletes itself", eph(true, v1alpha1.InfraEnded, v1alpha1.InfraContractReleased), 0, true},
		{"ended, still releasing: waits", eph(true, v1alpha1.InfraDeploying, v1alpha1.InfraContractReleasing), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &pass{obj: tc.obj, now: now}
			(&Reconciler{}).ephemeralEnd(p)
			if p.requeueAfter != tc.wantRequeue || p.deleteSelf != tc.wantDelete {
				t.Errorf("requeueAfter %s deleteSelf %v, want %s %v", p.requeueAfter, p.deleteSelf, tc.wantRequeue, tc.wantDelete)
			}
		})
	}
	// An Infra has no end.
	p := &pass{obj: wrap(&v1alpha1.Infra{}), now: now}
	(&Reconciler{}).ephemeralEnd(p)
	if p.requeueAfter != 0 || p.deleteSelf {
		t.Errorf("an Infra: requeueAfter %s deleteSelf %v", p.requeueAfter, p.deleteSelf)
	}
}
