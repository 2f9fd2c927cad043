package infra

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
)

// ephemeralDeadline sets an EphemeralInfra's status.expiresAt (creationTimestamp +
// ttlSeconds) and, until it has ended, asks to be woken at the deadline: the one timer.
func (r *Reconciler) ephemeralDeadline(p *pass) {
	e := p.obj.eph
	if e == nil {
		return
	}
	exp := infra.ExpiresAt(e.CreationTimestamp.Time, e.Spec.TTLSeconds)
	at := metav1.NewTime(exp)
	e.Status.ExpiresAt = &at
	if p.obj.ended() {
		return
	}
	if d, ok := infra.RequeueAfter(p.now, exp); ok {
		p.requeueAfter = d
	}
	// Ended is decided on the phases observed so far (status.contracts), so that an end
	// releases every contract in the same pass.
	var phases []v1alpha1.InfraContractPhase
	for _, c := range e.Status.Contracts {
		phases = append(phases, c.Phase)
	}
	ended, reason := infra.Ended(p.now, exp, e.Spec.EndWhen, phases, infra.AnyRequested(e.Status.Contracts, nil))
	if !ended {
		return
	}
	now := metav1.NewTime(p.now)
	e.Status.EndedAt, e.Status.EndReason = &now, reason
	p.requeueAfter = 0
	r.log().Info("ephemeralinfra_ended", "object", e.Namespace+"/"+e.Name, "reason", reason)
}

// ephemeralEnd deletes an ended EphemeralInfra once every contract is finished (phase
// Ended); the finalizer then does the record's final write and lets it go.
func (r *Reconciler) ephemeralEnd(p *pass) {
	if p.obj.ended() && p.obj.status.Phase == v1alpha1.InfraEnded {
		p.deleteSelf = true
	}
}
