package console

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/infra"
)

// Snapshot is everything one rendering of the page is made from: the objects as the
// informers hold them and the milestones the console saw happen.
type Snapshot struct {
	Infras     []v1alpha1.Infra
	Ephemerals []v1alpha1.EphemeralInfra
	Contracts  []v1alpha1.ComputeContract
	Clusters   []v1alpha1.Cluster
	NodeClaims []v1alpha1.NodeClaim
	// Seen are the milestones of each ComputeContract (by namespace/name) in the order the
	// console saw them.
	Seen map[string][]Milestone
	// Tenants are the insides of the tenant clusters the console watches, by namespace/name.
	Tenants map[string]TenantObjects
	// Logs are the tails of the guests' logs, by ComputeContract namespace/name.
	Logs map[string]string
	// PDSURL, when set, turns the at-URIs of records in its repos into links to its
	// com.atproto.repo.getRecord.
	PDSURL string
}

// View is the page's content.
type View struct {
	Deployments []DeploymentRow
	Clusters    []ClusterRow
}

// DeploymentRow is one Infra or EphemeralInfra.
type DeploymentRow struct {
	Kind, Namespace, Name, Description string
	Phase, Ready, ByPhase              string
	Record                             Link
	ExpiresAt                          string
	Contracts                          []ContractRow
}

// ID is the row's element id: stable across renderings, so the page keeps what was open.
func (d DeploymentRow) ID() string { return "d-" + d.Kind + "-" + d.Namespace + "-" + d.Name }

// ContractRow is one declared contract and, once requested, its ComputeContract.
type ContractRow struct {
	Name, State, Phase, ComputeKind, Winner, Message string
	// ComputeContract is the name of the ComputeContract ("" while staged).
	ComputeContract string
	Market          *Market
}

// Market is a ComputeContract's history on the market.
type Market struct {
	// ID is the element id of the market's details, stable across renderings.
	ID             string
	Phase, Message string
	RFP            Link
	Bids           []BidRow
	Accept         Link
	Receipt        Link
	Events         []EventRow
	Guest          string
	// Log is the tail of the guest's log, when its bidder is this process.
	Log      string
	Timeline []TimelineRow
}

// BidRow is one bid on the contract's RFP.
type BidRow struct {
	Bidder, Price, Refused string
	Won                    bool
	Record                 Link
}

// EventRow is one lifecycle record of the guest.
type EventRow struct {
	Type, At, Message string
	Record            Link
}

// TimelineRow is one step of a contract, Requested first.
type TimelineRow struct {
	// At is the time in UTC; Since is the time since the contract was requested.
	At, Since, What, Detail string
}

// Link is an at-URI and, when the console knows the PDS that serves it, where to read it.
type Link struct {
	URI  string
	Href string
}

// ClusterRow is one tenant Cluster and its NodeClaims.
type ClusterRow struct {
	Namespace, Name, Account, Phase, Server string
	Nodes                                   int32
	// Scaling is the Scaling condition's message: what the scale decision is doing and
	// which pending pods wait for a node.
	Scaling    string
	NodeClaims []NodeClaimRow
	// Watched says the console reads the cluster's apiserver: TenantNodes and Pending are
	// what it holds.
	Watched     bool
	TenantNodes []TenantNodeRow
	Pending     []PendingPodRow
}

// TenantNodeRow is one Node object of a tenant cluster.
type TenantNodeRow struct {
	Name, Ready string
	Pods        int
}

// PendingPodRow is a pod of a tenant cluster that no node took yet, and why.
type PendingPodRow struct {
	Namespace, Name, Reason string
}

// NodeClaimRow is one node a cluster rented or is renting.
type NodeClaimRow struct {
	Name, Phase, NodeName, Joined, Message, ComputeContract string
}

// MilestoneKind is what the console saw change on a ComputeContract.
type MilestoneKind string

const (
	// MilestoneCreated: the console saw the ComputeContract created, that is the contract
	// Requested, to the millisecond (its creationTimestamp has whole seconds).
	MilestoneCreated MilestoneKind = "created"
	MilestonePhase   MilestoneKind = "phase"
	MilestoneRFP     MilestoneKind = "rfp"
	MilestoneBid     MilestoneKind = "bid"
	MilestoneWinner  MilestoneKind = "winner"
	MilestoneAccept  MilestoneKind = "accept"
	MilestoneReceipt MilestoneKind = "receipt"
)

// Milestone is one change of a ComputeContract's status, stamped when the console saw it.
type Milestone struct {
	Kind   MilestoneKind
	Detail string
	At     time.Time
}

// Milestones is what is new in cur compared with prev (nil: the contract is new), stamped
// at. Events carry their own times and are not milestones.
func Milestones(prev, cur *v1alpha1.ComputeContract, at time.Time) []Milestone {
	var p v1alpha1.ComputeContractStatus
	if prev != nil {
		p = prev.Status
	}
	c := cur.Status
	var out []Milestone
	add := func(k MilestoneKind, d string) { out = append(out, Milestone{Kind: k, Detail: d, At: at}) }
	if prev == nil {
		add(MilestoneCreated, "")
	}
	if c.Phase != "" && c.Phase != p.Phase {
		add(MilestonePhase, string(c.Phase))
	}
	if c.RFP != "" && c.RFP != p.RFP {
		add(MilestoneRFP, c.RFP)
	}
	for _, b := range c.Bids {
		if !slices.ContainsFunc(p.Bids, func(o v1alpha1.ContractBid) bool { return o.URI == b.URI && o.Bidder == b.Bidder }) {
			add(MilestoneBid, bidText(b))
		}
	}
	if c.Winner != "" && c.Winner != p.Winner {
		add(MilestoneWinner, c.Winner)
	}
	if c.Accept != "" && c.Accept != p.Accept {
		add(MilestoneAccept, c.Accept)
	}
	if c.Receipt != "" && c.Receipt != p.Receipt {
		add(MilestoneReceipt, c.Receipt)
	}
	return out
}

func bidText(b v1alpha1.ContractBid) string {
	s := b.Bidder + " at " + price(b)
	if b.Refused != "" {
		s += " (refused: " + b.Refused + ")"
	}
	return s
}

func price(b v1alpha1.ContractBid) string {
	return strings.TrimSpace(cmp.Or(b.Cost, "?") + " " + b.Currency)
}

// Build turns a snapshot into the page's rows: deployments by kind, namespace and name, each
// contract in declared order, clusters with their claims.
func Build(s Snapshot) View {
	ccs := map[string]*v1alpha1.ComputeContract{}
	for i := range s.Contracts {
		cc := &s.Contracts[i]
		ccs[cc.Namespace+"/"+cc.Name] = cc
	}
	var v View
	for i := range s.Infras {
		inf := &s.Infras[i]
		v.Deployments = append(v.Deployments, deployment("Infra", inf.ObjectMeta, inf.Spec, inf.Status, nil, ccs, s))
	}
	for i := range s.Ephemerals {
		e := &s.Ephemerals[i]
		v.Deployments = append(v.Deployments, deployment("EphemeralInfra", e.ObjectMeta, e.Spec.InfraSpec, e.Status.InfraStatus, e.Status.ExpiresAt, ccs, s))
	}
	slices.SortFunc(v.Deployments, func(a, b DeploymentRow) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	claims := map[string][]NodeClaimRow{}
	for _, nc := range s.NodeClaims {
		k := cmp.Or(nc.Spec.ClusterRef.Namespace, nc.Namespace) + "/" + nc.Spec.ClusterRef.Name
		row := NodeClaimRow{Name: nc.Name, Phase: string(nc.Status.Phase), NodeName: cmp.Or(nc.Status.NodeName, nc.Spec.NodeName),
			Joined: stamp(nc.Status.JoinedAt), Message: nc.Status.Message}
		if nc.Status.Infra != nil {
			row.ComputeContract = nc.Status.Infra.ComputeContract
		}
		claims[k] = append(claims[k], row)
	}
	for _, c := range s.Clusters {
		row := ClusterRow{Namespace: c.Namespace, Name: c.Name, Account: c.Spec.Account, Phase: string(c.Status.Phase),
			Server: c.Status.Server, Nodes: c.Status.Nodes, NodeClaims: claims[c.Namespace+"/"+c.Name]}
		for _, cond := range c.Status.Conditions {
			if cond.Type == string(v1alpha1.ConditionScaling) {
				row.Scaling = cond.Message
			}
		}
		slices.SortFunc(row.NodeClaims, func(a, b NodeClaimRow) int { return cmp.Compare(a.Name, b.Name) })
		if t, ok := s.Tenants[c.Namespace+"/"+c.Name]; ok {
			row.Watched, row.TenantNodes, row.Pending = true, TenantNodes(t), PendingPods(t.Pods)
		}
		v.Clusters = append(v.Clusters, row)
	}
	slices.SortFunc(v.Clusters, func(a, b ClusterRow) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return v
}

func deployment(kind string, meta metav1.ObjectMeta, spec v1alpha1.InfraSpec, st v1alpha1.InfraStatus, expires *metav1.Time,
	ccs map[string]*v1alpha1.ComputeContract, s Snapshot) DeploymentRow {
	d := DeploymentRow{Kind: kind, Namespace: meta.Namespace, Name: meta.Name, Description: spec.Description,
		Phase: string(st.Phase), Ready: st.ContractsReady, ByPhase: st.ContractsByPhase, ExpiresAt: stamp(expires)}
	if st.Record != nil {
		d.Record = link(st.Record.URI, s.PDSURL)
	}
	status := map[string]v1alpha1.InfraContractStatus{}
	for _, c := range st.Contracts {
		status[c.Name] = c
	}
	for _, c := range spec.Contracts {
		cs := status[c.Name]
		row := ContractRow{Name: c.Name, State: string(c.State), Phase: string(cs.Phase), ComputeKind: string(c.ComputeKind),
			Winner: cs.Winner, Message: cs.Message, ComputeContract: cs.ComputeContract}
		if cc := ccs[meta.Namespace+"/"+cs.ComputeContract]; cs.ComputeContract != "" && cc != nil {
			row.Market = market(cc, s.Seen[cc.Namespace+"/"+cc.Name], s.PDSURL)
			row.Market.Log = s.Logs[cc.Namespace+"/"+cc.Name]
		}
		d.Contracts = append(d.Contracts, row)
	}
	return d
}

func market(cc *v1alpha1.ComputeContract, seen []Milestone, pdsURL string) *Market {
	st := cc.Status
	m := &Market{ID: "m-" + cc.Namespace + "-" + cc.Name, Phase: string(st.Phase), Message: st.Message, RFP: link(st.RFP, pdsURL), Accept: link(st.Accept, pdsURL),
		Receipt: link(st.Receipt, pdsURL)}
	for _, b := range st.Bids {
		m.Bids = append(m.Bids, BidRow{Bidder: b.Bidder, Price: price(b), Refused: b.Refused, Record: link(b.URI, pdsURL),
			Won: st.Winner != "" && b.Bidder == st.Winner && b.Refused == ""})
	}
	for _, e := range st.Events {
		m.Events = append(m.Events, EventRow{Type: e.Type, At: stamp(e.At), Message: e.Message, Record: link(e.URI, pdsURL)})
	}
	if g := st.Guest; g != nil {
		var ports []string
		for _, p := range g.Ports {
			ports = append(ports, fmt.Sprintf("%s %d->%d", p.Name, p.GuestPort, p.HostPort))
		}
		m.Guest = strings.TrimSpace(g.Address + " " + strings.Join(ports, ", "))
	}
	m.Timeline = Timeline(cc, seen)
	return m
}

// Timeline is a contract's steps from Requested (its ComputeContract's creation) on: the
// milestones the console saw, the guest's events and the conditions' transitions, each with
// its time and the time since Requested, oldest first.
//
// What the console saw carries milliseconds. Object times (creationTimestamp, an event's at,
// a condition's transition) carry whole seconds: each such step is shown to the second, "by"
// the end of its second, and placed there, since that is the latest it can have happened.
func Timeline(cc *v1alpha1.ComputeContract, seen []Milestone) []TimelineRow {
	type step struct {
		at           time.Time
		coarse       bool
		what, detail string
	}
	requested := step{cc.CreationTimestamp.Time, true, "Requested", "ComputeContract " + cc.Name + " created"}
	var steps []step
	for _, m := range seen {
		what := map[MilestoneKind]string{MilestonePhase: "phase", MilestoneRFP: "RFP published", MilestoneBid: "bid",
			MilestoneWinner: "winner", MilestoneAccept: "accepted", MilestoneReceipt: "receipt"}[m.Kind]
		switch m.Kind {
		case MilestoneCreated:
			requested.at, requested.coarse = m.At, false
			continue
		case MilestonePhase:
			what, m.Detail = m.Detail, ""
		}
		steps = append(steps, step{at: m.At, what: what, detail: m.Detail})
	}
	for _, e := range cc.Status.Events {
		if e.At != nil {
			steps = append(steps, step{e.At.Time, true, "event " + e.Type, e.Message})
		}
	}
	for _, c := range cc.Status.Conditions {
		steps = append(steps, step{c.LastTransitionTime.Time, true, c.Type + " " + string(c.Status), strings.TrimSpace(c.Reason + " " + c.Message)})
	}
	key := func(s step) time.Time {
		if s.coarse {
			return s.at.Truncate(time.Second).Add(time.Second - time.Millisecond)
		}
		return s.at
	}
	// Stable: what the console saw at the same instant keeps its order.
	slices.SortStableFunc(steps, func(a, b step) int { return key(a).Compare(key(b)) })
	// Requested is first whatever its precision; when the console did not see it, it is the
	// start of its second (creationTimestamp), the earliest it can have been.
	t0 := requested.at
	rows := []TimelineRow{{At: t0.UTC().Format("15:04:05.000"), Since: since(0), What: requested.what, Detail: requested.detail}}
	for _, s := range steps {
		r := TimelineRow{At: s.at.UTC().Format("15:04:05.000"), Since: since(s.at.Sub(t0)), What: s.what, Detail: s.detail}
		if s.coarse {
			r.At, r.Since = "by "+s.at.UTC().Format("15:04:05"), "by "+since(key(s).Sub(t0).Round(time.Second))
		}
		rows = append(rows, r)
	}
	return rows
}

func since(d time.Duration) string {
	if d < 0 {
		return "-" + since(-d)
	}
	return "+" + d.Round(time.Millisecond).String()
}

func stamp(t *metav1.Time) string {
	if t == nil || t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

// link is uri with, when it is a record at-URI and pdsURL is set, the PDS's getRecord for
// it. A URI that does not parse is shown, never linked.
func link(uri, pdsURL string) Link {
	l := Link{URI: uri}
	if uri == "" || pdsURL == "" {
		return l
	}
	a, err := infra.ParseATURI(uri)
	if err != nil {
		return l
	}
	q := url.Values{"repo": {a.DID.String()}, "collection": {a.Collection.String()}, "rkey": {a.Rkey.String()}}
	l.Href = strings.TrimRight(pdsURL, "/") + "/xrpc/com.atproto.repo.getRecord?" + q.Encode()
	return l
}
