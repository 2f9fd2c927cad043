package infra

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/api/v1alpha1"
)

const (
	maxNameLen       = 253
	maxLabelValueLen = 63
	nameHashLen      = 16
)

// ContractName is the name of the ComputeContract of contract in the deployment objectName:
// infra-<object>-<contract> (einfra- for an EphemeralInfra). A name longer than 253
// characters is cut and ends in 16 hex digits of the sha256 of the full name, so it stays
// unique and deterministic.
func ContractName(kind Kind, objectName, contract string) string {
	return hashedName(kind.prefix()+objectName+"-"+contract, maxNameLen)
}

// RecordChildName is the name of the AtprotoRecord child that writes the deployment's record:
// infra-<name> or einfra-<name>, hashed past 253 characters like ContractName.
func RecordChildName(kind Kind, objectName string) string {
	return hashedName(kind.prefix()+objectName, maxNameLen)
}

// LabelValue fits a name into a label value (63 characters), hashed like ContractName.
func LabelValue(s string) string { return hashedName(s, maxLabelValueLen) }

// ContractLabels are the labels of a deployment's ComputeContract.
func ContractLabels(kind Kind, objectName, contract string) map[string]string {
	return map[string]string{
		v1alpha1.LabelInfraKind:     string(kind),
		v1alpha1.LabelInfraName:     LabelValue(objectName),
		v1alpha1.LabelInfraContract: LabelValue(contract),
	}
}

func hashedName(full string, max int) string {
	if len(full) <= max {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	head := strings.TrimRight(full[:max-nameHashLen-1], "-.")
	return head + "-" + hex.EncodeToString(sum[:])[:nameHashLen]
}

// ObservePhase is the observed phase of a declared contract from its desired state and its
// ComputeContract's status (nil when there is no ComputeContract); existedBefore says the
// contract had a ComputeContract in an earlier reconcile.
//
//	ComputeContract         phase
//	none, state Staged      Staged
//	none, existed before    Released (a finished one was removed)
//	none, state Requested   Requesting (it is being created)
//	none, state Released    Released (nothing ran)
//	Pending, Requesting     Requesting
//	Held                    Deployed
//	Releasing               Releasing
//	Released                Released
//	Failed                  Failed
func ObservePhase(desired v1alpha1.ContractState, cc *v1alpha1.ComputeContractStatus, existedBefore bool) v1alpha1.InfraContractPhase {
	if cc == nil {
		switch {
		case desired == "" || desired == v1alpha1.ContractStaged:
			return v1alpha1.InfraContractStaged
		case existedBefore || desired == v1alpha1.ContractReleased:
			return v1alpha1.InfraContractReleased
		default:
			return v1alpha1.InfraContractRequesting
		}
	}
	switch cc.Phase {
	case v1alpha1.ComputeContractHeld:
		return v1alpha1.InfraContractDeployed
	case v1alpha1.ComputeContractReleasing:
		return v1alpha1.InfraContractReleasing
	case v1alpha1.ComputeContractReleased:
		return v1alpha1.InfraContractReleased
	case v1alpha1.ComputeContractFailed:
		return v1alpha1.InfraContractFailed
	}
	return v1alpha1.InfraContractRequesting // "", Pending, Requesting
}

// Finished reports whether a ComputeContract phase is terminal (Released or Failed).
func Finished(p v1alpha1.ComputeContractPhase) bool {
	return p == v1alpha1.ComputeContractReleased || p == v1alpha1.ComputeContractFailed
}

// ExistingContract is one ComputeContract the deployment owns, as listed by its labels.
type ExistingContract struct {
	// Name is the ComputeContract's name.
	Name string
	// Contract is the declared contract it runs (label infra.socialweb.computer/contract).
	Contract string
	// Status is the ComputeContract's status.
	Status v1alpha1.ComputeContractStatus
	// Release is its spec.release, nil when not released.
	Release *v1alpha1.ContractRelease
}

// ContractOp is what to do with one contract's ComputeContract.
type ContractOp string

const (
	// OpNothing: leave it.
	OpNothing ContractOp = "Nothing"
	// OpCreate: create the ComputeContract with Spec.
	OpCreate ContractOp = "Create"
	// OpSetRelease: set spec.release to Release.
	OpSetRelease ContractOp = "SetRelease"
	// OpDelete: delete the (finished) ComputeContract.
	OpDelete ContractOp = "Delete"
)

// ContractAction is the plan for one contract.
type ContractAction struct {
	Contract        string
	ComputeContract string
	Op              ContractOp
	Spec            *v1alpha1.ComputeContractSpec
	Release         *v1alpha1.ContractRelease
}

// ContractsInput is what PlanContracts looks at.
type ContractsInput struct {
	Kind       Kind
	ObjectName string
	// Spec is the object's spec (contracts, secrets, nodes).
	Spec v1alpha1.InfraSpec
	// Previous is status.contracts as the object holds it.
	Previous []v1alpha1.InfraContractStatus
	// Existing are the ComputeContracts the object owns.
	Existing []ExistingContract
	// Ended is true once an EphemeralInfra has ended: every contract is treated as Released.
	Ended bool
	// Now stamps a release that has no releaseRequestedAt of its own.
	Now time.Time
}

// ContractPlan is one action per contract (declared ones in spec order, then dropped ones by
// name) and the status.contracts to report.
type ContractPlan struct {
	Actions []ContractAction
	Status  []v1alpha1.InfraContractStatus
}

// Release reasons written into spec.release.reason.
const (
	ReleaseRequested = "requested"
	ReleaseStaged    = "staged"
	ReleaseRemoved   = "removed from spec"
	ReleaseEnded     = "ended"
	ReleaseDeleted   = "deleted"
)

// PlanContracts decides, for each contract, what to do with its ComputeContract:
//
//   - Staged: none is wanted. A finished one is deleted (so Requested later starts a new one);
//     an unfinished one is released first.
//   - Requested: one is created when none exists and none was seen before (status names the
//     ComputeContract only once it was observed, so a cache that lags a create never looks
//     like a finished contract; a second create meets AlreadyExists). A terminal one
//     (Released, Failed, or removed after it finished) is not requested again while the state
//     stays Requested. An existing one's spec is not rewritten.
//   - Released (and every contract of an ended EphemeralInfra): spec.release is set; a
//     releaseRequestedAt newer than the ComputeContract's release sends it again, Failed included.
//   - dropped from spec.contracts: released, and deleted once Released or Failed.
func PlanContracts(in ContractsInput) ContractPlan {
	byContract := map[string]*ExistingContract{}
	for i := range in.Existing {
		byContract[in.Existing[i].Contract] = &in.Existing[i]
	}
	prev := map[string]v1alpha1.InfraContractStatus{}
	for _, p := range in.Previous {
		prev[p.Name] = p
	}
	var plan ContractPlan
	declared := map[string]bool{}
	for _, c := range in.Spec.Contracts {
		declared[c.Name] = true
		name := ContractName(in.Kind, in.ObjectName, c.Name)
		cc := byContract[c.Name]
		p, had := prev[c.Name]
		existedBefore := had && p.ComputeContract != ""
		desired := c.State
		if desired == "" {
			desired = v1alpha1.ContractStaged
		}
		if in.Ended {
			desired = v1alpha1.ContractReleased
		}
		act := ContractAction{Contract: c.Name, ComputeContract: name, Op: OpNothing}
		switch desired {
		case v1alpha1.ContractStaged:
			act = settle(act, cc, ReleaseStaged, in.Now)
		case v1alpha1.ContractRequested:
			if cc == nil && !existedBefore {
				spec := ContractSpec(c, secretFor(in.Spec, c.Name), nodeFor(in.Spec, c.Name))
				spec.RepoRef = RequesterRepo(in.Spec)
				act.Op, act.Spec = OpCreate, &spec
			}
		case v1alpha1.ContractReleased:
			act = release(act, cc, c.ReleaseRequestedAt, releaseReason(in.Ended), in.Now)
		}
		plan.Actions = append(plan.Actions, act)

		st := v1alpha1.InfraContractStatus{Name: c.Name, ReleaseRequestedAt: p.ReleaseRequestedAt}
		var ccStatus *v1alpha1.ComputeContractStatus
		if cc != nil {
			ccStatus = &cc.Status
			st.ComputeContract = cc.Name
			st.Winner, st.Receipt, st.Message = cc.Status.Winner, cc.Status.Receipt, cc.Status.Message
		} else if existedBefore && desired != v1alpha1.ContractStaged {
			st.ComputeContract = p.ComputeContract
		}
		if act.Op == OpDelete && desired == v1alpha1.ContractStaged {
			st.ComputeContract = ""
			ccStatus = nil
		}
		st.Phase = ObservePhase(desired, ccStatus, existedBefore)
		if act.Op == OpDelete && desired == v1alpha1.ContractStaged {
			st.Phase = v1alpha1.InfraContractStaged
		}
		if act.Release != nil {
			t := act.Release.RequestedAt
			st.ReleaseRequestedAt = &t
		}
		plan.Status = append(plan.Status, st)
	}
	var dropped []*ExistingContract
	for i := range in.Existing {
		if !declared[in.Existing[i].Contract] {
			dropped = append(dropped, &in.Existing[i])
		}
	}
	sort.Slice(dropped, func(i, j int) bool { return dropped[i].Contract < dropped[j].Contract })
	for _, cc := range dropped {
		act := settle(ContractAction{Contract: cc.Contract, ComputeContract: cc.Name, Op: OpNothing}, cc, ReleaseRemoved, in.Now)
		plan.Actions = append(plan.Actions, act)
		plan.Status = append(plan.Status, v1alpha1.InfraContractStatus{
			Name: cc.Contract, ComputeContract: cc.Name, Winner: cc.Status.Winner, Receipt: cc.Status.Receipt,
			Phase:   ObservePhase(v1alpha1.ContractReleased, &cc.Status, true),
			Message: "removed from spec.contracts; released, then deleted",
		})
	}
	return plan
}

// settle releases an unfinished ComputeContract and deletes a finished one (the NodeClaim
// settle order).
func settle(act ContractAction, cc *ExistingContract, reason string, now time.Time) ContractAction {
	switch {
	case cc == nil:
	case Finished(cc.Status.Phase):
		act.Op = OpDelete
	case cc.Release == nil:
		act.Op = OpSetRelease
		act.Release = &v1alpha1.ContractRelease{RequestedAt: metav1.NewTime(now.UTC().Truncate(time.Second)), Reason: reason}
	}
	return act
}

// release sets spec.release on cc, or sets it again when requestedAt is newer than the one it has.
func release(act ContractAction, cc *ExistingContract, requestedAt *metav1.Time, reason string, now time.Time) ContractAction {
	if cc == nil {
		return act
	}
	at := metav1.NewTime(now.UTC().Truncate(time.Second))
	if requestedAt != nil {
		at = *requestedAt.DeepCopy()
	}
	if cc.Release != nil && (requestedAt == nil || !requestedAt.After(cc.Release.RequestedAt.Time)) {
		return act
	}
	act.Op = OpSetRelease
	act.Release = &v1alpha1.ContractRelease{RequestedAt: at, Reason: reason}
	return act
}

func releaseReason(ended bool) string {
	if ended {
		return ReleaseEnded
	}
	return ReleaseRequested
}

func secretFor(spec v1alpha1.InfraSpec, contract string) *v1alpha1.SecretKeyRef {
	for _, s := range spec.Secrets {
		if s.Contract == contract {
			r := s.SecretRef
			return &r
		}
	}
	return nil
}

func nodeFor(spec v1alpha1.InfraSpec, contract string) *v1alpha1.InfraContractNode {
	for i := range spec.Nodes {
		if spec.Nodes[i].Contract == contract {
			return spec.Nodes[i].DeepCopy()
		}
	}
	return nil
}

// NodeRequesterRepo is the AtprotoRepo, in the contract workspace, that a cluster Infra's
// node contracts run the market from while the Infra is bound to no record.
const NodeRequesterRepo = "node-requester"

// RequesterRepo is the repo a deployment's contracts run the market from: the AtprotoRepo
// its record lives in (spec.record.repoRef). The deployment and its contracts speak for one
// account. A cluster Infra's contracts always use NodeRequesterRepo of its workspace (`up`
// makes it for its local account), bound or not: its record is published to the cluster
// owner's repo only to show the nodes (publishInfra), and opting in must not change who
// requests them. Any other unbound deployment has none, and its requested contracts fail
// with InvalidSpec naming spec.repoRef.
func RequesterRepo(spec v1alpha1.InfraSpec) *v1alpha1.ObjectRef {
	if spec.ClusterRef != nil {
		return &v1alpha1.ObjectRef{Name: NodeRequesterRepo}
	}
	if spec.Record == nil {
		return nil
	}
	r := spec.Record.RepoRef
	return &r
}

// ContractSpec is the ComputeContract spec of one declared contract: its publishable fields,
// the Secret from spec.secrets as secretsRef, and from spec.nodes the node fields (ownerDid,
// adopt, nodeJoin). Nothing else: no repoRef, no release.
func ContractSpec(c v1alpha1.InfraContract, secretRef *v1alpha1.SecretKeyRef, node *v1alpha1.InfraContractNode) v1alpha1.ComputeContractSpec {
	c = *c.DeepCopy()
	kind := c.ComputeKind
	if kind == "" {
		kind = v1alpha1.ComputeKindVM
	}
	spec := v1alpha1.ComputeContractSpec{
		VMName:            c.VMName,
		ComputeKind:       kind,
		UserData:          c.UserData,
		BidderDids:        c.BidderDids,
		DenyBidderDids:    c.DenyBidderDids,
		SSHAuthorizedKeys: c.SSHAuthorizedKeys,
		Policy:            c.Policy,
		RequireIsolation:  c.RequireIsolation,
		RequireLayers:     c.RequireLayers,
		RequireArch:       c.RequireArch,
		PolicyArgs:        c.PolicyArgs,
		VMReadyTimeoutSec: c.VMReadyTimeoutSec,
		Ports:             c.Ports,
		CPUs:              c.CPUs,
		MemMiB:            c.MemMiB,
	}
	if secretRef != nil {
		r := *secretRef
		spec.SecretsRef = &r
	}
	if node != nil {
		node = node.DeepCopy()
		spec.OwnerDid, spec.Adopt, spec.NodeJoin = node.OwnerDid, node.Adopt, node.NodeJoin
	}
	return spec
}

// DeploymentPhase is the phase of a whole deployment, from its contracts' statuses (and their
// desired states in spec). Precedence, first match wins:
//
//  1. Deleting: the object is being deleted.
//  2. Ended: an ended EphemeralInfra whose contracts are all Staged, Released or Failed;
//     Ending while any is not.
//  3. Degraded: any contract Failed.
//  4. Deploying: any contract Requesting.
//  5. Releasing: any contract Releasing.
//  6. Staged: no contracts, or every contract Staged.
//  7. Deployed: some contract Deployed (every contract still wanted, the requested ones, is Deployed).
//  8. Released: everything else (every contract not Staged is Released).
func DeploymentPhase(contracts []v1alpha1.InfraContractStatus, deleting, ended bool) v1alpha1.InfraPhase {
	count := map[v1alpha1.InfraContractPhase]int{}
	for _, c := range contracts {
		count[c.Phase]++
	}
	finished := count[v1alpha1.InfraContractStaged] + count[v1alpha1.InfraContractReleased] + count[v1alpha1.InfraContractFailed]
	switch {
	case deleting:
		return v1alpha1.InfraDeleting
	case ended && finished == len(contracts):
		return v1alpha1.InfraEnded
	case ended:
		return v1alpha1.InfraEnding
	case count[v1alpha1.InfraContractFailed] > 0:
		return v1alpha1.InfraDegraded
	case count[v1alpha1.InfraContractRequesting] > 0:
		return v1alpha1.InfraDeploying
	case count[v1alpha1.InfraContractReleasing] > 0:
		return v1alpha1.InfraReleasing
	case count[v1alpha1.InfraContractStaged] == len(contracts):
		return v1alpha1.InfraStaged
	case count[v1alpha1.InfraContractDeployed] > 0:
		return v1alpha1.InfraDeployed
	}
	return v1alpha1.InfraReleased
}

// ContractsReady is status.contractsReady: deployed contracts over requested ones ("1/3"),
// counting the contracts whose spec state is Requested.
func ContractsReady(spec []v1alpha1.InfraContract, status []v1alpha1.InfraContractStatus) string {
	phase := map[string]v1alpha1.InfraContractPhase{}
	for _, s := range status {
		phase[s.Name] = s.Phase
	}
	requested, deployed := 0, 0
	for _, c := range spec {
		if c.State == v1alpha1.ContractRequested {
			requested++
			if phase[c.Name] == v1alpha1.InfraContractDeployed {
				deployed++
			}
		}
	}
	return itoa(deployed) + "/" + itoa(requested)
}

// contractPhaseOrder is the order of ContractsByPhase: a contract's lifecycle.
var contractPhaseOrder = []v1alpha1.InfraContractPhase{v1alpha1.InfraContractDeployed, v1alpha1.InfraContractRequesting,
	v1alpha1.InfraContractStaged, v1alpha1.InfraContractReleasing, v1alpha1.InfraContractReleased, v1alpha1.InfraContractFailed}

// ContractsByPhase is status.contractsByPhase: the declared contracts counted by observed
// phase in lifecycle order ("2 Deployed, 1 Staged"); a declared contract without a status
// yet counts as Staged, a phase this version does not know comes last by name; "none" when
// nothing is declared.
func ContractsByPhase(spec []v1alpha1.InfraContract, status []v1alpha1.InfraContractStatus) string {
	if len(spec) == 0 {
		return "none"
	}
	phase := map[string]v1alpha1.InfraContractPhase{}
	for _, s := range status {
		phase[s.Name] = s.Phase
	}
	count := map[v1alpha1.InfraContractPhase]int{}
	var other []v1alpha1.InfraContractPhase
	for _, c := range spec {
		p := phase[c.Name]
		if p == "" {
			p = v1alpha1.InfraContractStaged
		}
		if count[p] == 0 && !slices.Contains(contractPhaseOrder, p) {
			other = append(other, p)
		}
		count[p]++
	}
	slices.Sort(other)
	var parts []string
	for _, p := range append(slices.Clone(contractPhaseOrder), other...) {
		if n := count[p]; n > 0 {
			parts = append(parts, itoa(n)+" "+string(p))
		}
	}
	return strings.Join(parts, ", ")
}

// ExpiresAt is an EphemeralInfra's deadline: created + ttlSeconds (DefaultTTLSeconds when 0).
func ExpiresAt(created time.Time, ttlSeconds int32) time.Time {
	if ttlSeconds == 0 {
		ttlSeconds = DefaultTTLSeconds
	}
	return created.Add(time.Duration(ttlSeconds) * time.Second)
}

// Ended says whether an EphemeralInfra has ended and why (EndReasonDeadline or
// EndReasonComplete): at the deadline; or, with endWhen Complete (the default), once at least
// one contract was ever requested and every contract that is not Staged is Released or
// Failed. phases are the observed phases of the declared contracts. The caller keeps an end
// once recorded (status.endedAt is set once): Ended is not asked again.
func Ended(now, expiresAt time.Time, endWhen v1alpha1.EndWhen, phases []v1alpha1.InfraContractPhase, anyRequestedEver bool) (bool, string) {
	if !now.Before(expiresAt) {
		return true, EndReasonDeadline
	}
	if endWhen == v1alpha1.EndWhenDeadline || !anyRequestedEver {
		return false, ""
	}
	active := 0
	for _, p := range phases {
		switch p {
		case v1alpha1.InfraContractStaged:
		case v1alpha1.InfraContractReleased, v1alpha1.InfraContractFailed:
			active++
		default:
			return false, ""
		}
	}
	return active > 0, reasonIf(active > 0, EndReasonComplete)
}

func reasonIf(ok bool, r string) string {
	if ok {
		return r
	}
	return ""
}

// AnyRequested says whether a deployment ever asked for a contract: it owns a ComputeContract,
// or a contract's status names one or is past Staged.
func AnyRequested(previous []v1alpha1.InfraContractStatus, existing []ExistingContract) bool {
	if len(existing) > 0 {
		return true
	}
	for _, p := range previous {
		if p.ComputeContract != "" || (p.Phase != "" && p.Phase != v1alpha1.InfraContractStaged) {
			return true
		}
	}
	return false
}

// RequeueAfter is the delayed requeue that wakes an EphemeralInfra at its deadline; ok is
// false once the deadline has passed (nothing left to wait for). It is the one timer.
func RequeueAfter(now, expiresAt time.Time) (time.Duration, bool) {
	if !now.Before(expiresAt) {
		return 0, false
	}
	return expiresAt.Sub(now), true
}

// Finalize is what the release finalizer does in one pass.
type Finalize struct {
	// Release are ComputeContracts to set spec.release on (unfinished, not yet released).
	Release []string
	// Delete are finished ComputeContracts to delete.
	Delete []string
	// Wait is true while any ComputeContract is not finished; the ComputeContract watch wakes the object.
	Wait bool
	// Done is true when no ComputeContract is left: do the record's final write, update the
	// index, delete the record child (Retain) and remove the finalizer.
	Done bool
}

// FinalizePlan is the finalizer's pass over the ComputeContracts a deleted deployment owns:
// release every unfinished one, delete every finished one, wait while any is unfinished,
// and be done when none is left.
func FinalizePlan(existing []ExistingContract) Finalize {
	var f Finalize
	for _, cc := range existing {
		switch {
		case Finished(cc.Status.Phase):
			f.Delete = append(f.Delete, cc.Name)
		case cc.Release == nil:
			f.Release = append(f.Release, cc.Name)
			f.Wait = true
		default:
			f.Wait = true
		}
	}
	sort.Strings(f.Release)
	sort.Strings(f.Delete)
	f.Done = len(existing) == 0
	return f
}

// NeedsReleaseFinalizer reports whether a deployment has, or is about to have, something the
// release finalizer must clean up: a record binding (the final write, the index end) or a
// contract past Staged (a ComputeContract). A deployment of only staged contracts and no
// record owns nothing, so it goes without the finalizer and costs one write instead of two;
// the finalizer goes on in the pass that first needs it, before that pass's first side
// effect, and stays until deletion.
func NeedsReleaseFinalizer(spec v1alpha1.InfraSpec) bool {
	if spec.Record != nil {
		return true
	}
	for _, c := range spec.Contracts {
		if c.State != "" && c.State != v1alpha1.ContractStaged {
			return true
		}
	}
	return false
}
