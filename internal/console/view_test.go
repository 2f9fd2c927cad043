package console

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/html"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)

func contract(st v1alpha1.ComputeContractStatus) *v1alpha1.ComputeContract {
	return &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "infra-web-api",
		CreationTimestamp: metav1.NewTime(t0)}, Status: st}
}

func TestMilestones(t *testing.T) {
	bid := v1alpha1.ContractBid{URI: "at://did:plc:b/computer.socialweb.bid/1", Bidder: "did:plc:b", Cost: "0", Currency: "usd"}
	bid2 := v1alpha1.ContractBid{URI: "at://did:plc:c/computer.socialweb.bid/1", Bidder: "did:plc:c", Cost: "3", Refused: "denied"}
	for _, tc := range []struct {
		name      string
		prev, cur v1alpha1.ComputeContractStatus
		noPrev    bool
		want      []Milestone
	}{
		{name: "new and empty", noPrev: true, want: []Milestone{{Kind: MilestoneCreated, At: t0}}},
		{name: "new with a phase", noPrev: true, cur: v1alpha1.ComputeContractStatus{Phase: "Pending"},
			want: []Milestone{{Kind: MilestoneCreated, At: t0}, {Kind: MilestonePhase, Detail: "Pending", At: t0}}},
		{name: "nothing changed", prev: v1alpha1.ComputeContractStatus{Phase: "Requesting", Bids: []v1alpha1.ContractBid{bid}},
			cur: v1alpha1.ComputeContractStatus{Phase: "Requesting", Bids: []v1alpha1.ContractBid{bid}}},
		{name: "the RFP goes out", prev: v1alpha1.ComputeContractStatus{Phase: "Pending"},
			cur:  v1alpha1.ComputeContractStatus{Phase: "Requesting", RFP: "at://did:plc:a/computer.socialweb.rfp/1"},
			want: []Milestone{{Kind: MilestonePhase, Detail: "Requesting", At: t0}, {Kind: MilestoneRFP, Detail: "at://did:plc:a/computer.socialweb.rfp/1", At: t0}}},
		{name: "a second bid, refused", prev: v1alpha1.ComputeContractStatus{Bids: []v1alpha1.ContractBid{bid}},
			cur:  v1alpha1.ComputeContractStatus{Bids: []v1alpha1.ContractBid{bid, bid2}},
			want: []Milestone{{Kind: MilestoneBid, Detail: "did:plc:c at 3 (refused: denied)", At: t0}}},
		{name: "won, accepted, receipt, held", prev: v1alpha1.ComputeContractStatus{Phase: "Requesting", Bids: []v1alpha1.ContractBid{bid}},
			cur: v1alpha1.ComputeContractStatus{Phase: "Held", Bids: []v1alpha1.ContractBid{bid}, Winner: "did:plc:b", Accept: "at://a", Receipt: "at://r"},
			want: []Milestone{{Kind: MilestonePhase, Detail: "Held", At: t0}, {Kind: MilestoneWinner, Detail: "did:plc:b", At: t0},
				{Kind: MilestoneAccept, Detail: "at://a", At: t0}, {Kind: MilestoneReceipt, Detail: "at://r", At: t0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prev *v1alpha1.ComputeContract
			if !tc.noPrev {
				prev = contract(tc.prev)
			}
			got := Milestones(prev, contract(tc.cur), t0)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("milestones (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTimeline(t *testing.T) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	// Object times have whole seconds: the event happened within 16:00:01, the condition
	// within 16:00:00.
	ready := metav1.NewTime(at(time.Second))
	cc := contract(v1alpha1.ComputeContractStatus{
		Events:     []v1alpha1.ContractEvent{{Type: "ready", At: &ready, Message: "up"}, {Type: "no time"}},
		Conditions: []metav1.Condition{{Type: "SecretsDelivered", Status: "True", Reason: "Delivered", LastTransitionTime: metav1.NewTime(t0)}},
	})
	market := []Milestone{
		{Kind: MilestonePhase, Detail: "Pending", At: at(310 * time.Millisecond)},
		{Kind: MilestonePhase, Detail: "Requesting", At: at(500 * time.Millisecond)},
		{Kind: MilestoneRFP, Detail: "at://rfp", At: at(500 * time.Millisecond)},
		{Kind: MilestoneBid, Detail: "did:plc:b at 0 usd", At: at(700 * time.Millisecond)},
		{Kind: MilestonePhase, Detail: "Held", At: at(1200 * time.Millisecond)},
	}
	for _, tc := range []struct {
		name string
		seen []Milestone
		want []string
	}{
		{name: "the console saw it requested", seen: append([]Milestone{{Kind: MilestoneCreated, At: at(300 * time.Millisecond)}}, market...), want: []string{
			"16:00:00.300 | +0s | Requested | ComputeContract infra-web-api created",
			"16:00:00.310 | +10ms | Pending | ",
			"16:00:00.500 | +200ms | Requesting | ",
			"16:00:00.500 | +200ms | RFP published | at://rfp",
			"16:00:00.700 | +400ms | bid | did:plc:b at 0 usd",
			"by 16:00:00 | by +1s | SecretsDelivered True | Delivered",
			"16:00:01.200 | +900ms | Held | ",
			"by 16:00:01 | by +2s | event ready | up",
		}},
		{name: "it was requested before the console started", seen: market[4:], want: []string{
			"16:00:00.000 | +0s | Requested | ComputeContract infra-web-api created",
			"by 16:00:00 | by +1s | SecretsDelivered True | Delivered",
			"16:00:01.200 | +1.2s | Held | ",
			"by 16:00:01 | by +2s | event ready | up",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, r := range Timeline(cc, tc.seen) {
				got = append(got, strings.Join([]string{r.At, r.Since, r.What, r.Detail}, " | "))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("timeline (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLink(t *testing.T) {
	for _, tc := range []struct {
		uri, pds string
		want     Link
	}{
		{uri: "", pds: "http://127.0.0.1:1", want: Link{}},
		{uri: "at://did:plc:abc/computer.socialweb.rfp/3k", pds: "",
			want: Link{URI: "at://did:plc:abc/computer.socialweb.rfp/3k"}},
		{uri: "at://did:plc:abc/computer.socialweb.rfp/3k", pds: "http://127.0.0.1:1/",
			want: Link{URI: "at://did:plc:abc/computer.socialweb.rfp/3k",
				Href: "http://127.0.0.1:1/xrpc/com.atproto.repo.getRecord?collection=computer.socialweb.rfp&repo=did%3Aplc%3Aabc&rkey=3k"}},
		// Not a record URI, or not an at-URI at all: shown, never linked.
		{uri: "at://did:plc:abc", pds: "http://127.0.0.1:1", want: Link{URI: "at://did:plc:abc"}},
		{uri: `javascript:alert(1)//"><img src=x>`, pds: "http://127.0.0.1:1", want: Link{URI: `javascript:alert(1)//"><img src=x>`}},
	} {
		if got := link(tc.uri, tc.pds); got != tc.want {
			t.Errorf("link(%q, %q) = %+v, want %+v", tc.uri, tc.pds, got, tc.want)
		}
	}
}

func TestBuild(t *testing.T) {
	held := contract(v1alpha1.ComputeContractStatus{Phase: "Held", Winner: "did:plc:b", RFP: "at://did:plc:a/computer.socialweb.rfp/1",
		Bids:  []v1alpha1.ContractBid{{Bidder: "did:plc:c", Cost: "5", Refused: "too dear"}, {Bidder: "did:plc:b", Cost: "0", Currency: "usd"}},
		Guest: &v1alpha1.GuestStatus{Address: "127.0.0.1", Ports: []v1alpha1.GuestPort{{Name: "http", GuestPort: 8080, HostPort: 31000}}}})
	s := Snapshot{
		Infras: []v1alpha1.Infra{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
				Spec: v1alpha1.InfraSpec{Description: "d", Contracts: []v1alpha1.InfraContract{{Name: "api", State: "Requested", ComputeKind: "deno"}, {Name: "db", State: "Staged"}}},
				Status: v1alpha1.InfraStatus{Phase: "Deployed", ContractsReady: "1/1", ContractsByPhase: "1 Deployed, 1 Staged",
					Contracts: []v1alpha1.InfraContractStatus{{Name: "api", Phase: "Deployed", ComputeContract: "infra-web-api", Winner: "did:plc:b"}, {Name: "db", Phase: "Staged"}}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "a"}},
		},
		Ephemerals: []v1alpha1.EphemeralInfra{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e"}}},
		Contracts:  []v1alpha1.ComputeContract{*held},
		Clusters: []v1alpha1.Cluster{{ObjectMeta: metav1.ObjectMeta{Namespace: "acct", Name: "demo"}, Spec: v1alpha1.ClusterSpec{Account: "did:plc:o"},
			Status: v1alpha1.ClusterStatus{Phase: "Ready", Nodes: 1, Conditions: []metav1.Condition{{Type: "Scaling", Message: "1 pending pod: default/p"}}}}},
		NodeClaims: []v1alpha1.NodeClaim{
			{ObjectMeta: metav1.ObjectMeta{Namespace: "acct", Name: "demo-2"}, Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "demo"}, NodeName: "n2"}, Status: v1alpha1.NodeClaimStatus{Phase: "Bidding"}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "acct", Name: "demo-1"}, Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "demo"}, NodeName: "n1"},
				Status: v1alpha1.NodeClaimStatus{Phase: "Running", Infra: &v1alpha1.NodeClaimInfra{ComputeContract: "infra-node-1"}}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: "acct", Name: "other"}, Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "gone"}}},
		},
	}
	v := Build(s)
	var order []string
	for _, d := range v.Deployments {
		order = append(order, d.Kind+"/"+d.Name)
	}
	if diff := cmp.Diff([]string{"EphemeralInfra/e", "Infra/a", "Infra/web"}, order); diff != "" {
		t.Fatalf("deployment order (-want +got):\n%s", diff)
	}
	web := v.Deployments[2]
	if len(web.Contracts) != 2 || web.Contracts[1].Market != nil || web.Contracts[1].Phase != "Staged" {
		t.Fatalf("contracts %+v: want api with its market, db staged without one", web.Contracts)
	}
	m := web.Contracts[0].Market
	if m == nil || m.Phase != "Held" || m.Guest != "127.0.0.1 http 8080->31000" || len(m.Timeline) != 1 {
		t.Fatalf("market %+v", m)
	}
	wantBids := []BidRow{{Bidder: "did:plc:c", Price: "5", Refused: "too dear"}, {Bidder: "did:plc:b", Price: "0 usd", Won: true}}
	if diff := cmp.Diff(wantBids, m.Bids); diff != "" {
		t.Errorf("bids (-want +got):\n%s", diff)
	}
	if len(v.Clusters) != 1 || v.Clusters[0].Scaling != "1 pending pod: default/p" {
		t.Fatalf("clusters %+v", v.Clusters)
	}
	wantClaims := []NodeClaimRow{{Name: "demo-1", Phase: "Running", NodeName: "n1", ComputeContract: "infra-node-1"}, {Name: "demo-2", Phase: "Bidding", NodeName: "n2"}}
	if diff := cmp.Diff(wantClaims, v.Clusters[0].NodeClaims); diff != "" {
		t.Errorf("claims (-want +got):\n%s", diff)
	}
}

// Every string of a record or an object is shown as text: the rendering holds no element or
// attribute a hostile value brought in.
func TestRenderEscapesHostileValues(t *testing.T) {
	const evil = `"><img src=x onerror=alert(1)><script>alert(2)</script>`
	cc := contract(v1alpha1.ComputeContractStatus{Phase: "Held", Winner: evil, RFP: evil, Message: evil,
		Bids:   []v1alpha1.ContractBid{{Bidder: evil, Cost: evil, Currency: evil, URI: evil}},
		Events: []v1alpha1.ContractEvent{{Type: evil, Message: evil, URI: evil}}})
	s := Snapshot{PDSURL: "http://127.0.0.1:1",
		Infras: []v1alpha1.Infra{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
			Spec: v1alpha1.InfraSpec{Description: evil, Contracts: []v1alpha1.InfraContract{{Name: "api", ComputeKind: v1alpha1.ComputeKind(evil)}}},
			Status: v1alpha1.InfraStatus{Phase: v1alpha1.InfraPhase(evil), Record: &v1alpha1.InfraRecordStatus{URI: evil},
				Contracts: []v1alpha1.InfraContractStatus{{Name: "api", Phase: "Deployed", ComputeContract: cc.Name, Winner: evil, Message: evil}}}}},
		Contracts: []v1alpha1.ComputeContract{*cc},
		Clusters:  []v1alpha1.Cluster{{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: v1alpha1.ClusterSpec{Account: evil}, Status: v1alpha1.ClusterStatus{Server: evil}}},
		Seen:      map[string][]Milestone{"default/" + cc.Name: {{Kind: MilestoneBid, Detail: evil, At: t0}}},
	}
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, "view", Build(s)); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	doc, err := html.Parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	texts := 0
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && (n.Data == "img" || n.Data == "script") {
			t.Errorf("rendering holds a %s element:\n%s", n.Data, out)
		}
		for _, a := range n.Attr {
			if strings.HasPrefix(a.Key, "on") || strings.Contains(a.Val, "<") && a.Key == "href" {
				t.Errorf("rendering holds attribute %s=%q", a.Key, a.Val)
			}
		}
		if n.Type == html.TextNode && strings.Contains(n.Data, evil) {
			texts++
		}
	}
	// Shown, as text: description, phase, winner (twice), messages, bidder, price, event,
	// record URIs, the timeline's bid, the cluster's owner and server.
	if texts < 10 {
		t.Errorf("the hostile value is shown as text %d times, want it everywhere it was put:\n%s", texts, out)
	}
}
