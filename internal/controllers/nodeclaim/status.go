package nodeclaim

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
)

// nodeReadyPoll is how often a claim whose guest is up asks the tenant cluster whether its
// node is Ready (node registration wakes nothing here).
const nodeReadyPoll = 5 * time.Second

// nodeLivenessPoll is how often a Running claim asks again, so that a node that stops
// reporting Ready is Lost within the loss grace plus this.
const nodeLivenessPoll = 15 * time.Second

// contract reads the entry's ComputeContract by name; nil when there is none.
func (r *Reconciler) contract(ctx context.Context, p *pass) (*v1alpha1.ComputeContract, error) {
	var cc v1alpha1.ComputeContract
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: p.infraKey.Namespace, Name: p.contract}, &cc)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading ComputeContract %s: %w", p.contract, err)
	}
	if ref := metav1.GetControllerOf(&cc); p.infra != nil && ref != nil && ref.UID != p.infra.UID {
		return nil, nil // a deleted namesake's leftover
	}
	return &cc, nil
}

// observe maps the entry, its ComputeContract and the tenant node onto the claim's status.
func (r *Reconciler) observe(ctx context.Context, p *pass) error {
	cc, err := r.contract(ctx, p)
	if err != nil {
		return err
	}
	o := infra.NodeClaimObservation{Entry: p.state, Adopt: p.claim.Spec.Adopt, Previous: p.claim.Status.Phase}
	st := &p.claim.Status
	loc := &v1alpha1.NodeClaimInfra{Workspace: p.infraKey.Namespace, Name: p.infraKey.Name, Contract: p.entry}
	if p.infra != nil {
		for _, c := range p.infra.Status.Contracts {
			if c.Name == p.entry {
				o.Observed = c.Phase
				loc.ComputeContract = c.ComputeContract
			}
		}
	}
	msg := p.message
	if cc != nil {
		o.Contract = &cc.Status
		loc.ComputeContract = cc.Name
		if msg == "" {
			msg = cc.Status.Message
		}
		if cc.Status.Phase == v1alpha1.ComputeContractHeld && r.Nodes != nil && p.cluster != nil {
			ready, err := r.Nodes.NodeReady(ctx, p.clusterKey(), p.claim.Spec.NodeName)
			if err != nil {
				r.log().Info("nodeclaim_node_unknown", "claim", p.claim.Namespace+"/"+p.claim.Name, "error", err)
			}
			o.NodeReady = ready
		}
	}
	st.Phase = infra.NodeClaimPhaseOf(o)
	st.Infra = loc
	if cc != nil {
		if price := winningPrice(&cc.Status); price != nil {
			st.Price = price
		}
	}
	if !infra.NodeClaimEnded(o.Previous) || st.Message == "" {
		st.Message = msg // an ended claim keeps the reason it ended with
	}
	if st.Phase == v1alpha1.NodeClaimRunning {
		st.NodeName = p.claim.Spec.NodeName
		if st.JoinedAt == nil {
			now := metav1.Now()
			st.JoinedAt = &now
		}
	}
	if r.Nodes != nil && p.cluster != nil && cc != nil && cc.Status.Phase == v1alpha1.ComputeContractHeld && !infra.NodeClaimEnded(st.Phase) {
		r.graces(p, o.NodeReady)
	}
	return nil
}

// graces keeps the claim's NodeReady condition (its transition time is when the node was
// last seen change) and makes the claim Lost when its node never joined within the join
// grace, or stopped reporting Ready for the loss grace (infra.NodeOverdue). Lost releases the
// entry, and so the guest; the node host then claims a new node if pods still need one.
func (r *Reconciler) graces(p *pass, ready bool) {
	st := &p.claim.Status
	c := metav1.Condition{Type: string(v1alpha1.ConditionNodeReady), Status: metav1.ConditionFalse, Reason: "NotReady",
		Message: "the node has not reported Ready", ObservedGeneration: p.claim.Generation}
	if ready {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "Ready", "the node reports Ready"
	} else if st.JoinedAt == nil {
		c.Reason, c.Message = "Joining", "waiting for the node to join the cluster"
	}
	meta.SetStatusCondition(&st.Conditions, c)
	since := meta.FindStatusCondition(st.Conditions, c.Type).LastTransitionTime.Time
	g := r.Graces
	if g == (infra.NodeGraces{}) {
		g = infra.DefaultNodeGraces
	}
	lost, msg, wait := infra.NodeOverdue(ready, st.JoinedAt != nil, since, time.Now(), g)
	switch {
	case lost:
		st.Phase, st.Message = v1alpha1.NodeClaimLost, msg
		r.log().Warn("nodeclaim_lost", "claim", p.claim.Namespace+"/"+p.claim.Name, "reason", msg)
	case ready:
		// Finer than the loss grace, so a short grace is not overrun by the poll.
		p.requeueAfter = min(nodeLivenessPoll, max(g.Loss/2, time.Second))
	default:
		p.requeueAfter = min(nodeReadyPoll, wait)
	}
}

// writeStatus observes and writes the claim's status once: copy, change, compare, patch with
// an optimistic lock (reconcilekit.WriteStatus, locked on the version the claim is at now).
func (r *Reconciler) writeStatus(ctx context.Context, p *pass) error {
	if err := r.observe(ctx, p); err != nil {
		return err
	}
	p.claim.Status.ObservedGeneration = p.claim.Generation
	written, err := reconcilekit.WriteStatus(ctx, r.Client, p.stored, p.claim)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("writing status of %s/%s: %w", p.claim.Namespace, p.claim.Name, err)
	}
	if written && p.stored.Status.Phase != p.claim.Status.Phase {
		r.log().Info("nodeclaim_phase", "claim", p.claim.Namespace+"/"+p.claim.Name, "phase", p.claim.Status.Phase, "entry", p.entry)
	}
	return nil
}
