package computecontract

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
)

// accept applies the close of the bid window: the bids not taken are marked in the status
// with why, and the accept is written for the winner Next chose. An open window, no bids or
// every bid refused write nothing here (the phase says it).
func (r *Reconciler) accept(ctx context.Context, rd *round) (reconcile.Result, error) {
	st := &rd.obj.Status
	for _, ref := range rd.d.Refused {
		for i := range st.Bids {
			if st.Bids[i].URI == ref.Bid.URI {
				st.Bids[i].Refused = ref.Reason
			}
		}
	}
	if rd.d.Action != market.ActAccept {
		return reconcile.Result{}, nil
	}
	w := rd.d.Winner
	rfpRec, err := fetchOwn(ctx, rd.repo, st.RFP)
	if err != nil {
		return reconcile.Result{}, err
	}
	acc := mk.Accept{Bid: atrepo.StrongRef{URI: w.URI, CID: w.CID}, RFP: atrepo.StrongRef{URI: rfpRec.URI, CID: rfpRec.CID}}
	res, err := put(ctx, rd.repo, rd.obj, keyAccept, mk.AcceptNSID, acc)
	if err != nil {
		return reconcile.Result{}, err
	}
	st.Accept, st.Winner = res.URI, w.Bidder
	r.Index.Own(res.URI, rd.key)
	r.addEvent(st, evAccept, res.URI, rd.now)
	return reconcile.Result{}, nil
}
