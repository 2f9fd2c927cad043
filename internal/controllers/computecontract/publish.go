package computecontract

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/atrepo"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/crashpoint"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/substrate/node"
)

// publish writes the rfp of a contract that has none, with its compute.vm payload and policy
// record, and starts the bid window. With spec.secretsRef the Secret is read first and only
// its names go in the payload; a spec no payload can be written from stays Pending.
func (r *Reconciler) publish(ctx context.Context, rd *round) (reconcile.Result, error) {
	obj, st := rd.obj, &rd.obj.Status
	var names []string
	if obj.Spec.SecretsRef != nil {
		vals, err := r.readSecrets(ctx, obj)
		var se *SecretError
		if errors.As(err, &se) {
			// No rfp until the Secret is there: a winner would wait for values we cannot send.
			r.secretsCondition(obj, metav1.ConditionFalse, ReasonSecretUnavailable, se.Error())
			rd.d = market.Decision{Phase: v1alpha1.ComputeContractPending, Reason: ReasonSecretUnavailable, Message: se.Error()}
			return reconcile.Result{RequeueAfter: 2 * time.Second}, nil
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		names = secretNames(vals)
		r.secretsCondition(obj, metav1.ConditionFalse, ReasonAwaitingReceipt, fmt.Sprintf("%d secret(s) to deliver to the winner once its receipt binds", len(names)))
	}
	uri, err := r.writeRFP(ctx, rd.repo, obj, rd.policyNSID, names, rd.s.Window)
	var pe *PayloadError
	if errors.As(err, &pe) {
		// Nothing to retry until the spec changes (a change reconciles again).
		rd.d = market.Decision{Phase: v1alpha1.ComputeContractPending, Reason: ReasonInvalidPayload, Message: pe.Error()}
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	st.RFP = uri
	r.Index.Own(uri, rd.key)
	r.addEvent(st, evRFP, uri, rd.now)
	// The window starts now: decide again for a zero window.
	rd.d.RequeueAfter = rd.s.Window
	if rd.d.RequeueAfter == 0 {
		rd.d.RequeueAfter = time.Millisecond
	}
	return reconcile.Result{}, nil
}

// writeRFP writes the compute.vm payload, the policy record and the rfp naming both.
// secrets are the names (never the values) of the secrets the winner will be handed; window
// is the bid window, published so that a bidder does not bid once it has closed.
func (r *Reconciler) writeRFP(ctx context.Context, repo repos.Repo, obj *v1alpha1.ComputeContract, policyNSID string, secrets []string, window time.Duration) (string, error) {
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
		Policy: atrepo.StrongRef{URI: pw.URI, CID: pw.CID}, BidWindowMs: ptr.To(window.Milliseconds())}
	res, err := put(ctx, repo, obj, keyRFP, mk.RFPNSID, rfp)
	if err != nil {
		return "", fmt.Errorf("rfp: %w", err)
	}
	crashpoint.Hit(crashpoint.RequesterAfterRFP)
	return res.URI, nil
}

// rfpAgain writes the rfp once more, under a key of its own: the first rfp's payload and
// policy, a new createdAt and so a new window. Written once: a crash before the status
// records it finds the same record at that key.
func (r *Reconciler) rfpAgain(ctx context.Context, rd *round) (reconcile.Result, error) {
	st := &rd.obj.Status
	rec, err := fetchOwn(ctx, rd.repo, st.RFP)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("rfp %s: %w", st.RFP, err)
	}
	first, err := mk.DecodeRFP(rec.Value)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("rfp %s as read back: %w", st.RFP, err)
	}
	again := *first
	again.CreatedAt = r.Now().UTC().Format(time.RFC3339Nano)
	again.BidWindowMs = ptr.To(rd.s.Window.Milliseconds())
	res, err := put(ctx, rd.repo, rd.obj, keyRFPAgain, mk.RFPNSID, again)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("rfp written again: %w", err)
	}
	r.Log.Info("computecontract_rfp_again", "contract", rd.key.String(), "first", st.RFP, "rfp", res.URI)
	r.forgetRFP(st.RFP)
	st.RFP = res.URI
	r.Index.Own(res.URI, rd.key)
	r.addEvent(st, evRFP, res.URI, rd.now)
	return reconcile.Result{RequeueAfter: max(rd.s.Window, time.Millisecond)}, nil
}

// payloadOf is the compute.vm payload of spec. A node contract's userData is its nodeJoin
// as the JSON the node substrate boots from (node.Join{server, nodeName, labels, taints}); its credentials
// are the secrets (the join bundle Secret's kubeconfig and ca), never the payload.
func payloadOf(spec v1alpha1.ComputeContractSpec, secrets []string) (mk.ComputeVM, error) {
	kind := string(spec.ComputeKind)
	if kind == "" {
		kind = mk.ComputeVMComputeKindVM
	}
	size := askedSize(spec)
	vm := mk.ComputeVM{ComputeKind: &kind, Cpus: size.CPUs, Mem: size.MemMiB, Secrets: secrets}
	ud := spec.UserData
	if spec.ComputeKind == v1alpha1.ComputeKindNode && spec.NodeJoin != nil {
		if ud != "" {
			return vm, &PayloadError{Reason: "a node contract with nodeJoin takes no userData: its userData is the join"}
		}
		raw, err := json.Marshal(node.Join{Server: spec.NodeJoin.Server, NodeName: spec.NodeJoin.NodeName,
			Labels: spec.NodeJoin.Labels, Taints: spec.NodeJoin.Taints})
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
	// The CRD holds the spec's fields to the lexicon's limits, but not what comes from
	// elsewhere (the Secret's key count): checked here, with the field's path, before any
	// record is written.
	if err := vm.Validate(); err != nil {
		return vm, &PayloadError{Reason: err.Error()}
	}
	return vm, nil
}

// askedSize is the guest size spec asks the market for: its cpus and memMiB, each
// defaulted when unset.
func askedSize(spec v1alpha1.ComputeContractSpec) market.Size {
	size := market.Size{CPUs: v1alpha1.DefaultContractCPUs, MemMiB: v1alpha1.DefaultContractMemMiB}
	if spec.CPUs > 0 {
		size.CPUs = int64(spec.CPUs)
	}
	if spec.MemMiB > 0 {
		size.MemMiB = int64(spec.MemMiB)
	}
	return size
}

// ReasonInvalidPayload is the Ready reason of a contract whose spec makes no payload.
const ReasonInvalidPayload = "InvalidPayload"

// PayloadError is a spec no compute payload can be written from.
type PayloadError struct{ Reason string }

func (e *PayloadError) Error() string { return "compute payload: " + e.Reason }
