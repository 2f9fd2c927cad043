package computecontract

import (
	"context"
	"encoding/json"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/market"
)

// accept applies the close of the bid window: the bids not taken are marked in the status
// with why, and the accept is written for the winner Next chose, or the rfp is written
// again (a window with no bid that opened before this requester started). An open window,
// no bids or every bid refused write nothing here (the phase says it).
func (r *Reconciler) accept(ctx context.Context, rd *round) (reconcile.Result, error) {
	st := &rd.obj.Status
	for _, ref := range rd.d.Refused {
		for i := range st.Bids {
			if st.Bids[i].URI == ref.Bid.URI {
				st.Bids[i].Refused = ref.Reason
			}
		}
	}
	if rd.d.Action == market.ActRFPAgain {
		return r.rfpAgain(ctx, rd)
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
	crashpoint.Hit(crashpoint.RequesterAfterAccept)
	// The accept may be one a crashed round wrote: its bid is the winner.
	var written mk.Accept
	if err := json.Unmarshal(res.Value, &written); err != nil {
		return reconcile.Result{}, fmt.Errorf("accept %s as read back: %w", res.URI, err)
	}
	won, err := market.AcceptedBid(written.Bid.URI, written.Bid.CID, *w, rd.s.Bids)
	if err != nil {
		return reconcile.Result{}, err
	}
	if won.URI != w.URI {
		r.Log.Warn("computecontract_accept_found", "contract", rd.key.String(), "accept", res.URI, "bid", won.URI, "bidder", won.Bidder, "chosen_now", w.URI)
		for i := range st.Bids {
			if st.Bids[i].URI == won.URI {
				st.Bids[i].Refused = ""
			}
		}
	}
	st.Accept, st.Winner = res.URI, won.Bidder
	r.Index.Own(res.URI, rd.key)
	r.addEvent(st, evAccept, res.URI, rd.now)
	return reconcile.Result{}, nil
}
