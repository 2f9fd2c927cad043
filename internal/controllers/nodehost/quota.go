package nodehost

import (
	"context"
	"fmt"
	"time"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/quota/ledger"
	"socialweb.computer/internal/scale"
)

// ReasonQuotaExceeded is the Scaling reason of a scale-up a quota of the owner's cut.
const ReasonQuotaExceeded = "QuotaExceeded"

// quotaRecheck is how soon a Cluster whose scale-up a quota cut is decided again.
const quotaRecheck = 30 * time.Second

// UsageOf is what an account holds of nodes, pure: its claims (every cluster of it) that
// have not ended count as nodes, a claim being released included (its node is still
// there); the node time is the time every claim existed, up to now for one that still does
// (being released too), and the ledger's intervals of claims that are gone (keyed by UID:
// a claim the ledger has already counts once).
func UsageOf(claims []*v1alpha1.NodeClaim, gone map[string]quota.Interval) (quota.Usage, []quota.Interval) {
	var u quota.Usage
	ivs := make([]quota.Interval, 0, len(gone)+len(claims))
	for _, iv := range gone {
		ivs = append(ivs, iv)
	}
	for _, c := range claims {
		if !ClaimEnded(c) {
			u.Nodes++
		}
		if _, ok := gone[string(c.UID)]; !ok {
			ivs = append(ivs, quota.Interval{From: c.CreationTimestamp.Time})
		}
	}
	return u, ivs
}

// applyQuota cuts a Provision decision to what the owner's quotas allow: the decision is
// pure (internal/quota.Nodes); reading the account's claims and ledger is this.
func (r *Reconciler) applyQuota(ctx context.Context, p *pass, d scale.Decision) (scale.Decision, *quota.Exceeded, error) {
	if d.Action != scale.Provision || (r.Quota.Nodes <= 0 && r.Quota.NodeHours <= 0) {
		return d, nil, nil
	}
	account := p.cluster.Spec.Account
	var list v1alpha1.NodeClaimList
	if err := r.reader().List(ctx, &list); err != nil {
		return d, nil, err
	}
	var claims []*v1alpha1.NodeClaim
	for i := range list.Items {
		if list.Items[i].Spec.OwnerDid == account {
			claims = append(claims, &list.Items[i])
		}
	}
	gone, err := ledger.Read(ctx, r.reader(), account)
	if err != nil {
		return d, nil, err
	}
	u, ivs := UsageOf(claims, gone)
	u.NodeTime = quota.NodeTime(ivs, r.now())
	n, e := quota.Nodes(r.Quota, account, u, d.Provision)
	if e == nil {
		return d, nil, nil
	}
	if n == 0 {
		d.Action, d.Provision = scale.Hold, 0
	} else {
		d.Provision = n
	}
	return d, e, nil
}

// quotaMessage says what a quota cut and what the owner can do.
func quotaMessage(e *quota.Exceeded) string {
	flag := "--quota-nodes"
	if e.Quota == quota.QuotaNodeHours {
		flag = "--quota-node-hours"
	}
	return fmt.Sprintf("%s; free a node of the account's clusters, or ask the operator to raise %s", e.Error(), flag)
}
