package infra

import (
	"time"

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
	ended, reason := ephemeralEnded(p, e)
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
//
// A pass that observed the last contract finish has not ended the EphemeralInfra (the end
// is decided on the phases seen before it), and its own status write wakes nothing (the
// watch passes generation changes only): it asks for the next pass at once, which ends it,
// rather than leaving it to its deadline.
func (r *Reconciler) ephemeralEnd(p *pass) {
	e := p.obj.eph
	switch {
	case e == nil:
	case p.obj.ended():
		if p.obj.status.Phase == v1alpha1.InfraEnded {
			p.deleteSelf = true
		}
	default:
		if ended, _ := ephemeralEnded(p, e); ended {
			p.requeueAfter = endNext
		}
	}
}

// endNext is the requeue of a pass after which the EphemeralInfra ends.
const endNext = time.Millisecond

// ephemeralEnded is infra.Ended on e's status.contracts as they stand.
func ephemeralEnded(p *pass, e *v1alpha1.EphemeralInfra) (bool, string) {
	var phases []v1alpha1.InfraContractPhase
	for _, c := range e.Status.Contracts {
		phases = append(phases, c.Phase)
	}
	return infra.Ended(p.now, infra.ExpiresAt(e.CreationTimestamp.Time, e.Spec.TTLSeconds), e.Spec.EndWhen, phases,
		infra.AnyRequested(e.Status.Contracts, nil))
}
