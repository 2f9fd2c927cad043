package computecontract

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/repos"
)

// read gets a contract ready for its step: the release finalizer on before any write to the
// market (a final contract being deleted lets go instead), the spec read into the market
// state, our repo and the index caught up on its firehose, then what the index holds for
// the contract (observe). A nil round ends the reconcile with the result and error given.
func (r *Reconciler) read(ctx context.Context, key types.NamespacedName, obj *v1alpha1.ComputeContract) (*round, reconcile.Result, error) {
	deleting := obj.DeletionTimestamp != nil
	if deleting && !controllerutil.ContainsFinalizer(obj, v1alpha1.FinalizerComputeContractRelease) {
		return nil, reconcile.Result{}, nil
	}
	if !deleting {
		if _, err := reconcilekit.EnsureFinalizer(ctx, r.Client, obj, v1alpha1.FinalizerComputeContractRelease); err != nil {
			res, err := reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
			return nil, res, err
		}
	}
	orig := obj.DeepCopy()
	st := &obj.Status
	now := r.Now()
	if st.Phase == "" {
		st.Phase = v1alpha1.ComputeContractPending
	}
	final := st.Phase == v1alpha1.ComputeContractReleased || st.Phase == v1alpha1.ComputeContractFailed
	if deleting && final {
		res, err := r.dropFinalizer(ctx, obj)
		return nil, res, err
	}
	s, policyNSID, required, specErr := specState(obj, now, deleting)
	if specErr != nil && !final {
		res, err := r.write(ctx, orig, obj, market.Decision{Phase: v1alpha1.ComputeContractFailed, Reason: market.ReasonBadSpec, Message: market.ReasonBadSpec + ": " + specErr.Error()})
		return nil, res, err
	}
	if final {
		return nil, reconcile.Result{}, nil
	}
	repo, err := r.Resolver.ForRef(ctx, obj.Namespace, *obj.Spec.RepoRef)
	if err != nil {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "RepoUnavailable", Message: err.Error(), ObservedGeneration: obj.Generation})
		_, werr := r.write(ctx, orig, obj, market.Decision{Phase: st.Phase, Message: st.Message})
		retry := repos.RetryAfter(err)
		if retry == 0 {
			retry = 2 * time.Second
		}
		return nil, reconcile.Result{RequeueAfter: retry}, werr
	}
	r.Index.Follow(r.runCtx(), feed.Source{Endpoint: repo.Endpoint(), Events: repo.Events(), Fetch: r.fetcherFor(repo.Endpoint())})
	if !r.Index.CaughtUp(repo.Endpoint()) {
		// A restarted requester must not close a window on an index still replaying.
		return nil, reconcile.Result{RequeueAfter: 50 * time.Millisecond}, nil
	}
	rd := &round{key: key, obj: obj, orig: orig, now: now, deleting: deleting, repo: repo,
		policyNSID: policyNSID, required: required, priceCap: s.Policy.PriceCap, s: s}
	if err := r.observe(ctx, rd); err != nil {
		return nil, reconcile.Result{}, err
	}
	return rd, reconcile.Result{}, nil
}

// specState is the part of the market state the spec sets: the release asked, the bidder
// lists, the window, answer wait and ready timeout; with spec.policy's record collection and
// spec.requireIsolation. specErr is the first thing in the spec the market cannot run.
func specState(obj *v1alpha1.ComputeContract, now time.Time, deleting bool) (s market.State, policyNSID string, required market.Boundary, specErr error) {
	s = market.State{Now: now, Phase: obj.Status.Phase, Release: deleting || obj.Spec.Release != nil,
		BidderDids: obj.Spec.BidderDids, Deny: obj.Spec.DenyBidderDids}
	s.Window, specErr = market.SecondsArg(obj.Spec.PolicyArgs, market.ArgBidWindow, market.DefaultBidWindow)
	if specErr == nil {
		s.AnswerWait, specErr = market.SecondsArg(obj.Spec.PolicyArgs, market.ArgAnswerWait, market.DefaultAnswerWait)
	}
	if specErr == nil {
		s.Policy.PriceCap, specErr = market.PriceCapArg(obj.Spec.PolicyArgs)
	}
	s.ReadyTimeout = market.DefaultReadyTimeout
	if obj.Spec.VMReadyTimeoutSec != nil {
		s.ReadyTimeout = time.Duration(*obj.Spec.VMReadyTimeoutSec) * time.Second
	}
	var perr error
	policyNSID, perr = market.PolicyName(obj.Spec.Policy)
	if specErr == nil {
		specErr = perr
	}
	var rerr error
	required, rerr = market.ParseRequirement(string(obj.Spec.RequireIsolation))
	if specErr == nil {
		specErr = rerr
	}
	if _, aerr := market.ParseArch(obj.Spec.RequireArch); specErr == nil {
		specErr = aerr
	}
	if specErr == nil && obj.Spec.RepoRef == nil {
		specErr = fmt.Errorf("spec.repoRef names no AtprotoRepo")
	}
	return s, policyNSID, required, specErr
}

// observe fills the market state with what the index and our repo hold for the contract:
// the rfp's time, the bids and bidders, our accept and the receipt that binds it, the
// winner's events on it; the status keeps the bids, the receipt, the guest's address and
// the events seen.
func (r *Reconciler) observe(ctx context.Context, rd *round) error {
	obj, key, repo := rd.obj, rd.key, rd.repo
	st, s := &obj.Status, &rd.s
	s.Policy = market.Policy{NSID: rd.policyNSID, RequesterDID: repo.DID(), PriceCap: rd.priceCap}
	s.RFPAt = at(lastEvent(st, evRFP))
	// Bids are held to the size the rfp's payload asks; the spec says the same unless it
	// changed since the payload was written.
	s.Asked = askedSize(obj.Spec)
	if st.RFP != "" {
		// The window counts from the rfp's createdAt (our own clock, to the nanosecond), not
		// from the status event, which the API keeps to the second (see at).
		if rfp, ok := r.rfpOf(ctx, repo, st.RFP); ok {
			s.RFPAt = rfp.created
			if rfp.asked != (market.Size{}) {
				s.Asked = rfp.asked
			}
		}
	}
	s.WatchingSince = r.since()
	s.RFPAgain = st.RFP != "" && isKey(obj, st.RFP, keyRFPAgain)
	s.AcceptAt = at(lastEvent(st, evAccept))
	s.DeleteAt = at(lastEvent(st, evDelete))
	if obj.Spec.Release != nil {
		s.ReleaseAt = market.Origin(obj.Spec.Release.RequestedAt.Time)
	} else if rd.deleting {
		s.ReleaseAt = market.Origin(obj.DeletionTimestamp.Time)
	}
	if st.RFP != "" {
		r.Index.Own(st.RFP, key)
		s.Bids = r.Index.Bids(st.RFP)
	}
	// Only the bidders that boot this kind of guest are waited for: a deno bidder never
	// answers a node contract, and waiting for it would hold every node rfp to its deadline.
	// With requireIsolation, requireLayers or requireArch, only those whose offering states
	// them (the first two for the kind).
	s.Offering = market.OfferingRule{Require: rd.required, Layers: obj.Spec.RequireLayers, Arch: obj.Spec.RequireArch, Kind: string(obj.Spec.ComputeKind)}
	if rd.required != market.BoundaryNone {
		s.Offering.Stated = r.Index.Stated(string(obj.Spec.ComputeKind))
	}
	if len(obj.Spec.RequireLayers) > 0 {
		s.Offering.StatedLayers = r.Index.StatedLayers(string(obj.Spec.ComputeKind))
	}
	if obj.Spec.RequireArch != "" {
		s.Offering.StatedArchs = r.Index.StatedArchs()
	}
	s.Bidders = market.Bidders(r.Index.Offerings(string(obj.Spec.ComputeKind)), obj.Spec.BidderDids, obj.Spec.DenyBidderDids, s.Offering)
	s.Winner = st.Winner
	if err := r.observeReceipt(ctx, rd); err != nil {
		return err
	}
	s.SecretsWanted = obj.Spec.SecretsRef != nil
	s.SecretsDelivered = meta.IsStatusConditionTrue(st.Conditions, string(v1alpha1.ConditionSecretsDelivered))
	// Bids seen, for the status.
	st.Bids = st.Bids[:0]
	for _, b := range s.Bids {
		cost := fmt.Sprint(b.Price())
		st.Bids = append(st.Bids, v1alpha1.ContractBid{URI: b.URI, Bidder: b.Bidder, Cost: cost, Currency: b.Currency})
	}
	return nil
}

// rfpRead is what the requester keeps of one of its rfps, read once per process: its
// createdAt, and the size its payload asks (what every bid is held to).
type rfpRead struct {
	created time.Time
	asked   market.Size
}

// rfpOf reads our rfp at uri and its payload from our repo the first time they are asked for
// in this process; false when the rfp cannot be read or its createdAt parsed (the caller
// falls back on the status event's time). A payload that cannot be read leaves asked zero
// and is read again next time (the caller falls back on the spec's size).
func (r *Reconciler) rfpOf(ctx context.Context, repo repos.Repo, uri string) (rfpRead, bool) {
	r.mu.Lock()
	got, ok := r.rfps[uri]
	r.mu.Unlock()
	if ok {
		return got, true
	}
	rec, err := fetchOwn(ctx, repo, uri)
	if err != nil {
		return rfpRead{}, false
	}
	rfp, err := mk.DecodeRFP(rec.Value)
	if err != nil {
		return rfpRead{}, false
	}
	got.created, err = time.Parse(time.RFC3339Nano, rfp.CreatedAt)
	if err != nil {
		return rfpRead{}, false
	}
	prec, err := fetchOwn(ctx, repo, rfp.Payload.URI)
	if err != nil {
		return got, true
	}
	vm, err := mk.DecodeComputeVM(prec.Value)
	if err != nil {
		return got, true
	}
	got.asked = market.Size{CPUs: vm.Cpus, MemMiB: vm.Mem}
	r.mu.Lock()
	if r.rfps == nil {
		r.rfps = map[string]rfpRead{}
	}
	r.rfps[uri] = got
	r.mu.Unlock()
	return got, true
}

// forgetRFP drops what rfpOf kept for a contract that ended.
func (r *Reconciler) forgetRFP(uri string) {
	r.mu.Lock()
	delete(r.rfps, uri)
	r.mu.Unlock()
}

// guestPorts are a vm.onNetwork event's port bindings as status.guest.ports.
func guestPorts(ps []mk.ComputeEventsVMOnNetworkPortBinding) []v1alpha1.GuestPort {
	var out []v1alpha1.GuestPort
	for _, p := range ps {
		out = append(out, v1alpha1.GuestPort{Name: p.Name, GuestPort: int32(p.Guest), HostPort: int32(p.Host)})
	}
	return out
}

func lastEventURI(st *v1alpha1.ComputeContractStatus, uri string) bool {
	for _, e := range st.Events {
		if e.URI == uri {
			return true
		}
	}
	return false
}

func shortKind(nsid string) string {
	const p = "com.publicdomainrelay.temp.market.compute.events."
	if len(nsid) > len(p) && nsid[:len(p)] == p {
		return nsid[len(p):]
	}
	return nsid
}

func lastEvent(st *v1alpha1.ComputeContractStatus, typ string) *v1alpha1.ContractEvent {
	for i := len(st.Events) - 1; i >= 0; i-- {
		if st.Events[i].Type == typ {
			return &st.Events[i]
		}
	}
	return nil
}

// at is the deadline origin of an event recorded in status (market.Origin: the API keeps its
// time to the second).
func at(e *v1alpha1.ContractEvent) time.Time {
	if e == nil || e.At == nil {
		return time.Time{}
	}
	return market.Origin(e.At.Time)
}
