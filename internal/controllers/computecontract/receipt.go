package computecontract

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
)

// observeReceipt reads our accept back from our repo (its cid is what a receipt must bind),
// takes the receipt that binds it from the index, and the winner's events on that receipt:
// vm.started, vm.onNetwork (the guest's address in the status), vm.delete (the guest ended).
// Each event is kept once in status.events.
func (r *Reconciler) observeReceipt(ctx context.Context, rd *round) error {
	obj, key, repo, now := rd.obj, rd.key, rd.repo, rd.now
	st, s := &obj.Status, &rd.s
	if st.Accept != "" {
		r.Index.Own(st.Accept, key)
		rec, err := fetchOwn(ctx, repo, st.Accept)
		if err != nil {
			return fmt.Errorf("read our accept: %w", err)
		}
		s.Accept = market.Ref{URI: rec.URI, CID: rec.CID}
		for _, rc := range r.Index.Receipts(st.Accept) {
			if market.Binds(rc, s.Accept, st.Winner) == nil {
				rc := rc
				s.Receipt = &rc
			}
		}
	}
	if s.Receipt != nil {
		st.Receipt = s.Receipt.URI
		r.Index.Own(s.Receipt.URI, key)
		for _, e := range r.Index.Events(s.Receipt.URI) {
			if e.Author != st.Winner {
				continue
			}
			switch e.Kind {
			case mk.ComputeEventsVMStartedNSID:
				s.Started = true
			case mk.ComputeEventsVMOnNetworkNSID:
				st.Guest = &v1alpha1.GuestStatus{Address: e.Address, Ports: guestPorts(e.Ports)}
			case mk.ComputeEventsVMDeleteNSID:
				s.Ended, s.EndedReason = true, e.Reason
			}
			if lastEventURI(st, e.URI) {
				continue
			}
			t := metav1.NewTime(now)
			st.Events = append(st.Events, v1alpha1.ContractEvent{URI: e.URI, Type: shortKind(e.Kind), At: &t})
		}
	}
	return nil
}
