// Package computecontract is the requester: it runs a ComputeContract through the market
// from the requester's repo (spec.repoRef), learning of bids, receipts and events from the
// firehose, and records the outcome in the status. The decisions are market.Next.
package computecontract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate/node"
)

// ControllerName names the controller in logs and metrics.
const ControllerName = "computecontract"

// Event types kept in status.events for the requester's own records.
const (
	evRFP    = "rfp"
	evAccept = "accept"
	evDelete = "delete"
)

// Reconciler reconciles ComputeContracts.
type Reconciler struct {
	Client   client.Client
	Resolver *repos.Resolver
	Index    *Index
	Log      *slog.Logger
	Now      func() time.Time

	local *pds.Server // the embedded PDS, whose firehose and records are read in-process
	mu    sync.Mutex
	// rfpTimes are the createdAt of our rfps (uri ->), read once per process.
	rfpTimes map[string]time.Time
	ctx      context.Context // the manager's: the index's followers live as long as it
}

// Setup registers the controller. A contract's requester follows the firehose of its repo's
// PDS (in-process for local, the embedded PDS) and every firehose of sources (PDS or relay
// URLs) besides, from the start: bidders are the offerings seen on any of them. A record a
// source does not serve itself (a relay's) is read from its DID's PDS, resolved through dir
// (nil: not at all).
func Setup(m ctrl.Manager, res *repos.Resolver, local *pds.Server, sources []string, dir identity.Directory, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	log = log.With("controller", ControllerName)
	wake := make(chan event.GenericEvent, 1024)
	r := &Reconciler{Client: m.GetClient(), Resolver: res, Log: log, Now: time.Now, local: local}
	r.Index = &Index{Log: log, Wake: func(k types.NamespacedName) {
		o := &v1alpha1.ComputeContract{}
		o.Namespace, o.Name = k.Namespace, k.Name
		wake <- event.GenericEvent{Object: o}
	}}
	// The index's followers live as long as the manager.
	if err := m.Add(runnableFunc(func(ctx context.Context) error {
		r.mu.Lock()
		r.ctx = ctx
		r.mu.Unlock()
		for _, src := range feed.Sources(sources, local, dir) {
			r.Index.Follow(ctx, src)
		}
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.ComputeContract{}).
		WatchesRawSource(source.Channel(wake, &handler.EnqueueRequestForObject{})).
		WithOptions(manager.ControllerOptions(16)).
		Complete(manager.Observed(ControllerName, r, obs))
}

type runnableFunc func(context.Context) error

func (f runnableFunc) Start(ctx context.Context) error { return f(ctx) }

func (r *Reconciler) runCtx() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx != nil {
		return r.ctx
	}
	return context.Background()
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

// Reconcile moves one contract on.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.ComputeContract
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	deleting := obj.DeletionTimestamp != nil
	if deleting && !controllerutil.ContainsFinalizer(&obj, v1alpha1.FinalizerComputeContractRelease) {
		return reconcile.Result{}, nil
	}
	if !deleting {
		if _, err := reconcilekit.EnsureFinalizer(ctx, r.Client, &obj, v1alpha1.FinalizerComputeContractRelease); err != nil {
			return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
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
		return r.dropFinalizer(ctx, &obj)
	}

	s := market.State{Now: now, Phase: st.Phase, Release: deleting || obj.Spec.Release != nil,
		BidderDids: obj.Spec.BidderDids, Deny: obj.Spec.DenyBidderDids}
	var specErr error
	s.Window, specErr = market.SecondsArg(obj.Spec.PolicyArgs, market.ArgBidWindow, market.DefaultBidWindow)
	if specErr == nil {
		s.AnswerWait, specErr = market.SecondsArg(obj.Spec.PolicyArgs, market.ArgAnswerWait, market.DefaultAnswerWait)
	}
	s.ReadyTimeout = market.DefaultReadyTimeout
	if obj.Spec.VMReadyTimeoutSec != nil {
		s.ReadyTimeout = time.Duration(*obj.Spec.VMReadyTimeoutSec) * time.Second
	}
	policyNSID, perr := market.PolicyName(obj.Spec.Policy)
	if specErr == nil {
		specErr = perr
	}
	required, rerr := market.ParseRequirement(string(obj.Spec.RequireIsolation))
	if specErr == nil {
		specErr = rerr
	}
	if specErr == nil && obj.Spec.RepoRef == nil {
		specErr = fmt.Errorf("spec.repoRef names no AtprotoRepo")
	}
	if specErr != nil && !final {
		return r.write(ctx, orig, &obj, market.Decision{Phase: v1alpha1.ComputeContractFailed, Reason: market.ReasonBadSpec, Message: market.ReasonBadSpec + ": " + specErr.Error()})
	}
	if final {
		return reconcile.Result{}, nil
	}
	repo, err := r.Resolver.ForRef(ctx, obj.Namespace, *obj.Spec.RepoRef)
	if err != nil {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "RepoUnavailable", Message: err.Error(), ObservedGeneration: obj.Generation})
		_, werr := r.write(ctx, orig, &obj, market.Decision{Phase: st.Phase, Message: st.Message})
		retry := repos.RetryAfter(err)
		if retry == 0 {
			retry = 2 * time.Second
		}
		return reconcile.Result{RequeueAfter: retry}, werr
	}
	r.Index.Follow(r.runCtx(), feed.Source{Endpoint: repo.Endpoint(), Events: repo.Events(), Fetch: r.fetcherFor(repo.Endpoint())})
	if !r.Index.CaughtUp(repo.Endpoint()) {
		// A restarted requester must not close a window on an index still replaying.
		return reconcile.Result{RequeueAfter: 50 * time.Millisecond}, nil
	}
	key := req.NamespacedName
	s.Policy = market.Policy{NSID: policyNSID, RequesterDID: repo.DID()}
	s.RFPAt = at(lastEvent(st, evRFP))
	if st.RFP != "" {
		// The window counts from the rfp's createdAt (our own clock, to the nanosecond), not
		// from the status event, which the API keeps to the second (see at).
		if t, ok := r.rfpCreated(ctx, repo, st.RFP); ok {
			s.RFPAt = t
		}
	}
	s.AcceptAt = at(lastEvent(st, evAccept))
	s.DeleteAt = at(lastEvent(st, evDelete))
	if obj.Spec.Release != nil {
		s.ReleaseAt = market.Origin(obj.Spec.Release.RequestedAt.Time)
	} else if deleting {
		s.ReleaseAt = market.Origin(obj.DeletionTimestamp.Time)
	}
	if st.RFP != "" {
		r.Index.Own(st.RFP, key)
		s.Bids = r.Index.Bids(st.RFP)
	}
	// Only the bidders that boot this kind of guest are waited for: a deno bidder never
	// answers a node contract, and waiting for it would hold every node rfp to its deadline.
	// With requireIsolation or requireLayers, only those whose offering states them for the kind.
	s.Isolation = market.IsolationRule{Require: required, Layers: obj.Spec.RequireLayers, Kind: string(obj.Spec.ComputeKind)}
	if required != market.BoundaryNone {
		s.Isolation.Stated = r.Index.Stated(string(obj.Spec.ComputeKind))
	}
	if len(obj.Spec.RequireLayers) > 0 {
		s.Isolation.StatedLayers = r.Index.StatedLayers(string(obj.Spec.ComputeKind))
	}
	s.Bidders = market.Bidders(r.Index.Offerings(string(obj.Spec.ComputeKind)), obj.Spec.BidderDids, obj.Spec.DenyBidderDids, s.Isolation)
	s.Winner = st.Winner
	if st.Accept != "" {
		r.Index.Own(st.Accept, key)
		_, coll, rkey, _ := feed.ParseURI(st.Accept)
		rec, err := repo.Get(ctx, coll, rkey)
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("read our accept: %w", err)
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
				s.Ended = true
			}
			if lastEventURI(st, e.URI) {
				continue
			}
			t := metav1.NewTime(now)
			st.Events = append(st.Events, v1alpha1.ContractEvent{URI: e.URI, Type: shortKind(e.Kind), At: &t})
		}
	}
	s.SecretsWanted = obj.Spec.SecretsRef != nil
	s.SecretsDelivered = meta.IsStatusConditionTrue(st.Conditions, string(v1alpha1.ConditionSecretsDelivered))
	// Bids seen, for the status.
	st.Bids = st.Bids[:0]
	for _, b := range s.Bids {
		cost := fmt.Sprint(b.Price())
		st.Bids = append(st.Bids, v1alpha1.ContractBid{URI: b.URI, Bidder: b.Bidder, Cost: cost, Currency: b.Currency})
	}

	d := market.Next(s)
	for _, ref := range d.Refused {
		for i := range st.Bids {
			if st.Bids[i].URI == ref.Bid.URI {
				st.Bids[i].Refused = ref.Reason
			}
		}
	}
	switch d.Action {
	case market.ActRFP:
		var names []string
		if obj.Spec.SecretsRef != nil {
			vals, err := r.readSecrets(ctx, &obj)
			var se *SecretError
			if errors.As(err, &se) {
				// No rfp until the Secret is there: a winner would wait for values we cannot send.
				r.secretsCondition(&obj, metav1.ConditionFalse, ReasonSecretUnavailable, se.Error())
				_, werr := r.write(ctx, orig, &obj, market.Decision{Phase: v1alpha1.ComputeContractPending, Reason: ReasonSecretUnavailable, Message: se.Error()})
				return reconcile.Result{RequeueAfter: 2 * time.Second}, werr
			}
			if err != nil {
				return reconcile.Result{}, err
			}
			names = secretNames(vals)
			r.secretsCondition(&obj, metav1.ConditionFalse, ReasonAwaitingReceipt, fmt.Sprintf("%d secret(s) to deliver to the winner once its receipt binds", len(names)))
		}
		uri, err := r.writeRFP(ctx, repo, &obj, policyNSID, names)
		var pe *PayloadError
		if errors.As(err, &pe) {
			// Nothing to retry until the spec changes (a change reconciles again).
			return r.write(ctx, orig, &obj, market.Decision{Phase: v1alpha1.ComputeContractPending, Reason: ReasonInvalidPayload, Message: pe.Error()})
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		st.RFP = uri
		r.Index.Own(uri, key)
		r.addEvent(st, evRFP, uri, now)
		// The window starts now: decide again for a zero window.
		d.RequeueAfter = s.Window
		if d.RequeueAfter == 0 {
			d.RequeueAfter = time.Millisecond
		}
	case market.ActAccept:
		w := d.Winner
		rfpRec, err := fetchOwn(ctx, repo, st.RFP)
		if err != nil {
			return reconcile.Result{}, err
		}
		acc := mk.Accept{Bid: atrepo.StrongRef{URI: w.URI, CID: w.CID}, RFP: atrepo.StrongRef{URI: rfpRec.URI, CID: rfpRec.CID}}
		res, err := put(ctx, repo, &obj, keyAccept, mk.AcceptNSID, acc)
		if err != nil {
			return reconcile.Result{}, err
		}
		st.Accept, st.Winner = res.URI, w.Bidder
		r.Index.Own(res.URI, key)
		r.addEvent(st, evAccept, res.URI, now)
	case market.ActDeliverSecrets:
		err := r.deliver(ctx, repo, &obj)
		if err == nil {
			s.SecretsDelivered = true
			d = market.Next(s)
			break
		}
		var se *SecretError
		var de *DeliveryError
		switch {
		case errors.As(err, &se):
			r.secretsCondition(&obj, metav1.ConditionFalse, ReasonSecretUnavailable, se.Error())
		case errors.As(err, &de):
			r.secretsCondition(&obj, metav1.ConditionFalse, ReasonDeliveryFailed, de.Error())
		default:
			return reconcile.Result{}, err
		}
		// Retried (d.RequeueAfter, at most a second) until the ready deadline.
	case market.ActDelete:
		reason := "released"
		if obj.Spec.Release != nil && obj.Spec.Release.Reason != "" {
			reason = obj.Spec.Release.Reason
		} else if d.Reason != "" {
			reason = d.Reason
		}
		ev := mk.Event{Receipt: atrepo.StrongRef{URI: s.Receipt.URI, CID: s.Receipt.CID},
			Payload: mk.EventPayload{ComputeEventsVMDelete: &mk.ComputeEventsVMDelete{Reason: &reason}}}
		res, err := put(ctx, repo, &obj, keyDelete, mk.EventNSID, ev)
		if err != nil {
			return reconcile.Result{}, err
		}
		r.addEvent(st, evDelete, res.URI, now)
	}
	if d.Phase == v1alpha1.ComputeContractReleased && st.ReleasedAt == nil {
		t := metav1.NewTime(now)
		st.ReleasedAt = &t
	}
	res, err := r.write(ctx, orig, &obj, d)
	if err != nil {
		return res, err
	}
	if d.Phase == v1alpha1.ComputeContractReleased || d.Phase == v1alpha1.ComputeContractFailed {
		r.forgetRFP(st.RFP)
	}
	if deleting && (d.Phase == v1alpha1.ComputeContractReleased || d.Phase == v1alpha1.ComputeContractFailed) {
		return r.dropFinalizer(ctx, &obj)
	}
	return res, nil
}

// rfpCreated is the createdAt of our rfp at uri, read from our repo the first time it is
// asked for in this process; false when it cannot be read or parsed (the caller falls back
// on the status event's time).
func (r *Reconciler) rfpCreated(ctx context.Context, repo repos.Repo, uri string) (time.Time, bool) {
	r.mu.Lock()
	t, ok := r.rfpTimes[uri]
	r.mu.Unlock()
	if ok {
		return t, true
	}
	rec, err := fetchOwn(ctx, repo, uri)
	if err != nil {
		return time.Time{}, false
	}
	rfp, err := mk.DecodeRFP(rec.Value)
	if err != nil {
		return time.Time{}, false
	}
	t, err = time.Parse(time.RFC3339Nano, rfp.CreatedAt)
	if err != nil {
		return time.Time{}, false
	}
	r.mu.Lock()
	if r.rfpTimes == nil {
		r.rfpTimes = map[string]time.Time{}
	}
	r.rfpTimes[uri] = t
	r.mu.Unlock()
	return t, true
}

// forgetRFP drops what rfpCreated kept for a contract that ended.
func (r *Reconciler) forgetRFP(uri string) {
	r.mu.Lock()
	delete(r.rfpTimes, uri)
	r.mu.Unlock()
}

// fetcherFor reads the records of the PDS at endpoint: in-process when it is the embedded
// one, over XRPC without a session otherwise.
func (r *Reconciler) fetcherFor(endpoint string) feed.Fetcher {
	return feed.SourceOf(endpoint, r.local, nil).Fetch
}

// guestPorts are a vm.onNetwork event's port bindings as status.guest.ports.
func guestPorts(ps []mk.ComputeEventsVMOnNetworkPortBinding) []v1alpha1.GuestPort {
	var out []v1alpha1.GuestPort
	for _, p := range ps {
		out = append(out, v1alpha1.GuestPort{Name: p.Name, GuestPort: int32(p.Guest), HostPort: int32(p.Host)})
	}
	return out
}

// deliver sends the contract's secrets to the winner and records the condition.
func (r *Reconciler) deliver(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract) error {
	vals, err := r.readSecrets(ctx, obj)
	if err != nil {
		return err
	}
	winner := obj.Status.Winner
	if err := deliverSecrets(ctx, repo, r.Index.Endpoint(winner), winner, obj.Status.Accept, vals); err != nil {
		return err
	}
	r.secretsCondition(obj, metav1.ConditionTrue, ReasonDelivered, fmt.Sprintf("%d secret(s) delivered to %s", len(vals), winner))
	r.Log.Info("computecontract_secrets_delivered", "contract", obj.Namespace+"/"+obj.Name, "winner", winner, "count", len(vals))
	return nil
}

func (r *Reconciler) secretsCondition(obj *v1alpha1.ComputeContract, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&obj.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionSecretsDelivered),
		Status: status, Reason: reason, Message: msg, ObservedGeneration: obj.Generation})
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

func (r *Reconciler) addEvent(st *v1alpha1.ComputeContractStatus, typ, uri string, now time.Time) {
	t := metav1.NewTime(now)
	st.Events = append(st.Events, v1alpha1.ContractEvent{Type: typ, URI: uri, At: &t})
}

// Record keys of a contract's records, derived from the object so a write repeated after a
// stale read or a crash finds the record written before (feed.DerivedTID).
const (
	keyPayload = iota
	keyPolicy
	keyRFP
	keyAccept
	keyDelete
)

func put(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract, n int, coll string, v any) (*repos.Record, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return feed.PutOnce(ctx, repo, coll, feed.DerivedTID(string(obj.UID), obj.CreationTimestamp.Time, n), raw)
}

func fetchOwn(ctx context.Context, repo repos.Repo, uri string) (*repos.Record, error) {
	_, coll, rkey, err := feed.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	return repo.Get(ctx, coll, rkey)
}

// writeRFP writes the compute.vm payload, the policy record and the rfp naming both.
// secrets are the names (never the values) of the secrets the winner will be handed.
func (r *Reconciler) writeRFP(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract, policyNSID string, secrets []string) (string, error) {
	vm, err := payloadOf(obj.Spec, secrets)
	if err != nil {
		return "", err
	}
	pay, err := put(ctx, repo, obj, keyPayload, mk.ComputeVMNSID, vm)
	if err != nil {
		return "", fmt.Errorf("compute.vm: %w", err)
	}
	var pol any = mk.PoliciesOpen{}
	if policyNSID == mk.PoliciesOnlyMeNSID {
		pol = mk.PoliciesOnlyMe{RequesterDID: repo.DID()}
	}
	pw, err := put(ctx, repo, obj, keyPolicy, policyNSID, pol)
	if err != nil {
		return "", fmt.Errorf("policy: %w", err)
	}
	rfp := mk.RFP{CreatedAt: r.Now().UTC().Format(time.RFC3339Nano), Payload: atrepo.StrongRef{URI: pay.URI, CID: pay.CID},
		Policy: atrepo.StrongRef{URI: pw.URI, CID: pw.CID}}
	res, err := put(ctx, repo, obj, keyRFP, mk.RFPNSID, rfp)
	if err != nil {
		return "", fmt.Errorf("rfp: %w", err)
	}
	return res.URI, nil
}

// payloadOf is the compute.vm payload of spec. A node contract's userData is its nodeJoin
// as the JSON the node substrate boots from (node.Join{server, nodeName}); its credentials
// are the secrets (the join bundle Secret's kubeconfig and ca), never the payload.
func payloadOf(spec v1alpha1.ComputeContractSpec, secrets []string) (mk.ComputeVM, error) {
	kind := string(spec.ComputeKind)
	if kind == "" {
		kind = mk.ComputeVMComputeKindVM
	}
	vm := mk.ComputeVM{ComputeKind: &kind, Cpus: 1, Mem: 256, Secrets: secrets}
	ud := spec.UserData
	if spec.ComputeKind == v1alpha1.ComputeKindNode && spec.NodeJoin != nil {
		if ud != "" {
			return vm, &PayloadError{Reason: "a node contract with nodeJoin takes no userData: its userData is the join"}
		}
		raw, err := json.Marshal(node.Join{Server: spec.NodeJoin.Server, NodeName: spec.NodeJoin.NodeName})
		if err != nil {
			return vm, err
		}
		ud = string(raw)
	}
	if ud != "" {
		vm.UserData = &ud
	}
	for _, p := range spec.Ports {
		vm.Ports = append(vm.Ports, mk.ComputeVMPort{Name: p.Name, Port: int64(p.Port)})
	}
	return vm, nil
}

// ReasonInvalidPayload is the Ready reason of a contract whose spec makes no payload.
const ReasonInvalidPayload = "InvalidPayload"

// PayloadError is a spec no compute payload can be written from.
type PayloadError struct{ Reason string }

func (e *PayloadError) Error() string { return "compute payload: " + e.Reason }

// write records the decided phase, reason and message once, and returns the requeue.
func (r *Reconciler) write(ctx context.Context, orig, obj *v1alpha1.ComputeContract, d market.Decision) (reconcile.Result, error) {
	st := &obj.Status
	st.ObservedGeneration = obj.Generation
	st.Phase = d.Phase
	if d.Message != "" {
		st.Message = d.Message
	}
	cond := metav1.Condition{Type: "Ready", ObservedGeneration: obj.Generation, Reason: string(d.Phase), Message: st.Message}
	if d.Reason != "" {
		cond.Reason = d.Reason
	}
	cond.Status = metav1.ConditionFalse
	if d.Phase == v1alpha1.ComputeContractHeld {
		cond.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	res, err := reconcilekit.CommitStatus(ctx, r.Client, orig, obj)
	if err != nil || res.RequeueAfter > 0 {
		return res, client.IgnoreNotFound(err)
	}
	if orig.Status.Phase != st.Phase {
		r.Log.Info("computecontract_phase", "contract", obj.Namespace+"/"+obj.Name, "phase", st.Phase, "message", st.Message)
	}
	return reconcile.Result{RequeueAfter: d.RequeueAfter}, nil
}

// dropFinalizer lets a finished contract go; a conflict reads again soon.
func (r *Reconciler) dropFinalizer(ctx context.Context, obj *v1alpha1.ComputeContract) (reconcile.Result, error) {
	_, err := reconcilekit.RemoveFinalizer(ctx, r.Client, obj, v1alpha1.FinalizerComputeContractRelease)
	return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
}
