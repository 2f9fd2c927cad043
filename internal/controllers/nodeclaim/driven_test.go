package nodeclaim_test

// Suites of the NodeClaim controller against the real embedded core, with the real Infra
// controller beside it. No guest joins yet (the kubelet guest is a later step): the suites
// named DrivenStatus drive each ComputeContract's status from the test, as the market and
// the guest will.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	infractl "socialweb.computer/internal/controllers/infra"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/quota/ledger"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/testenv"
)

const (
	home    = "acct-test"
	gateway = nodeclaim.DefaultContractNamespace
	server  = "https://10.77.0.1:6443"
)

// pkiBundler mints real join bundles from a cluster CA made in a temp dir: the minting is
// the real one, only the control plane is not running.
type pkiBundler struct{ root string }

func (b pkiBundler) MintNodeBundle(k tenant.Key, node string) (tenant.NodeBundle, error) {
	return tenant.MintNodeBundle(b.root, k, node, server, 0)
}

// drivenNodes answers whether a tenant node is Ready from what the test set, and records the
// nodes deleted and revoked: no kubelet runs in these suites.
type drivenNodes struct{ ready, deleted, revoked sync.Map }

func (d *drivenNodes) NodeReady(_ context.Context, _ tenant.Key, name string) (bool, error) {
	_, ok := d.ready.Load(name)
	return ok, nil
}

func (d *drivenNodes) DeleteNode(_ context.Context, _ tenant.Key, name string) error {
	d.ready.Delete(name)
	d.deleted.Store(name, true)
	return nil
}

func (d *drivenNodes) RevokeNode(_ tenant.Key, name string) error {
	d.revoked.Store(name, true)
	return nil
}

func (d *drivenNodes) wasRevoked(name string) bool {
	_, ok := d.revoked.Load(name)
	return ok
}

func (d *drivenNodes) wasDeleted(name string) bool {
	_, ok := d.deleted.Load(name)
	return ok
}

type rig struct {
	t      *testing.T
	env    *testenv.Env
	c      client.Client
	root   string
	nodes  drivenNodes
	graces infra.NodeGraces // zero: the defaults
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newRig starts the core and, unless manual, a manager with the Infra and NodeClaim
// controllers only (no ComputeContract controller: the test drives contract status).
func newRig(t *testing.T, manual bool) *rig {
	env := testenv.Start(t, testenv.Options{})
	r := &rig{t: t, env: env, c: env.Client, root: t.TempDir()}
	if !manual {
		r.start()
	}
	return r
}

// start runs the Infra and NodeClaim controllers in one manager until the test ends.
func (r *rig) start() {
	t, env := r.t, r.env
	m, err := ctrlmanager.New(env.Config, ctrlmanager.Options{SkipNameValidation: true, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := infractl.Setup(m, &repos.Resolver{Client: m.GetClient()}, nil, quiet(), nil); err != nil {
		t.Fatal(err)
	}
	if err := nodeclaim.Setup(m, nodeclaim.Options{Bundler: pkiBundler{r.root}, Nodes: &r.nodes, BidWindow: 1500 * time.Millisecond, Graces: r.graces, Log: quiet()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = m.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
}

func (r *rig) cluster(name string, mods ...func(*v1alpha1.ClusterSpec)) *v1alpha1.Cluster {
	r.t.Helper()
	c := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: name},
		Spec: v1alpha1.ClusterSpec{Account: "did:plc:owner", Name: name, MaxNodes: 4}}
	for _, m := range mods {
		m(&c.Spec)
	}
	if err := r.c.Create(context.Background(), c); err != nil {
		r.t.Fatal(err)
	}
	if _, err := tenant.EnsurePKI(tenant.LayoutFor(r.root, home, name).PKI(), []net.IP{net.IPv4(127, 0, 0, 1)}, nil); err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) claim(name, cluster string) *v1alpha1.NodeClaim {
	r.t.Helper()
	return r.sizedClaim(name, cluster, 0, 0)
}

// sizedClaim is claim for a node of cpus and memMiB (0: unset).
func (r *rig) sizedClaim(name, cluster string, cpus, memMiB int32) *v1alpha1.NodeClaim {
	r.t.Helper()
	c := &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: home, Name: name},
		Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: cluster}, NodeName: name, OwnerDid: "did:plc:owner",
			CPUs: cpus, MemMiB: memMiB}}
	if err := r.c.Create(context.Background(), c); err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) get(key types.NamespacedName, o client.Object) bool {
	r.t.Helper()
	err := r.c.Get(context.Background(), key, o)
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return true
}

func (r *rig) infraOf(cluster string) (*v1alpha1.Infra, bool) {
	var inf v1alpha1.Infra
	ok := r.get(types.NamespacedName{Namespace: gateway, Name: infra.ClusterInfraName(home, cluster)}, &inf)
	return &inf, ok
}

func (r *rig) nodeClaim(name string) (*v1alpha1.NodeClaim, bool) {
	var c v1alpha1.NodeClaim
	ok := r.get(types.NamespacedName{Namespace: home, Name: name}, &c)
	return &c, ok
}

func (r *rig) contract(name string) (*v1alpha1.ComputeContract, bool) {
	var cc v1alpha1.ComputeContract
	ok := r.get(types.NamespacedName{Namespace: gateway, Name: name}, &cc)
	return &cc, ok
}

// contractOf is the ComputeContract name of a claim's entry.
func contractOf(cluster string, claim *v1alpha1.NodeClaim) string {
	return infra.ContractName(infra.KindInfra, infra.ClusterInfraName(home, cluster), infra.NodeEntryName(string(claim.UID)))
}

func (r *rig) eventually(what string, f func() (bool, string)) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok, detail := f()
		if ok {
			return
		}
		last = detail
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("%s: not within 30s; last: %s", what, last)
}

// drive sets a ComputeContract's status, as the market (and the guest) will.
func (r *rig) drive(name string, phase v1alpha1.ComputeContractPhase, guest bool) {
	r.t.Helper()
	for i := 0; ; i++ {
		cc, ok := r.contract(name)
		if !ok {
			r.t.Fatalf("ComputeContract %s does not exist", name)
		}
		cc.Status.Phase = phase
		if phase == v1alpha1.ComputeContractHeld {
			cc.Status.Winner = "did:plc:winner"
		}
		if guest {
			cc.Status.Guest = &v1alpha1.GuestStatus{Address: "10.77.0.9"}
		}
		err := r.c.Status().Update(context.Background(), cc)
		if err == nil {
			return
		}
		if !apierrors.IsConflict(err) || i > 20 {
			r.t.Fatalf("status of %s: %v", name, err)
		}
	}
}

func entryState(inf *v1alpha1.Infra, entry string) v1alpha1.ContractState {
	if e, ok := infra.NodeEntryOf(inf.Spec, entry); ok {
		return e.State
	}
	return ""
}

// Two claims of one cluster: one Infra in the gateway workspace with two Requested entries,
// each ComputeContract owned by the Infra and carrying nodeJoin, ownerDid and the bundle;
// the claims report Bidding, then Provisioning and Joining as the contracts are driven.
func TestNodeClaims_DrivenStatus_TwoClaimsOneInfra(t *testing.T) {
	r := newRig(t, false)
	r.cluster("web", func(s *v1alpha1.ClusterSpec) {
		s.NodeIsolation, s.NodeMaxPrice, s.NodeArch = v1alpha1.IsolationVM, &v1alpha1.NodePrice{Cost: 7, Currency: "USD"}, "arm64"
	})
	a, b := r.sizedClaim("node-a", "web", 2, 1024), r.claim("node-b", "web")

	var inf *v1alpha1.Infra
	r.eventually("one Infra with two Requested entries", func() (bool, string) {
		got, ok := r.infraOf("web")
		if !ok {
			return false, "no Infra"
		}
		inf = got
		sa, sb := entryState(got, infra.NodeEntryName(string(a.UID))), entryState(got, infra.NodeEntryName(string(b.UID)))
		return sa == v1alpha1.ContractRequested && sb == v1alpha1.ContractRequested, fmt.Sprintf("entries %s %s", sa, sb)
	})
	if inf.Labels[v1alpha1.LabelInfraCluster] != "web" || inf.Spec.ClusterRef == nil || *inf.Spec.ClusterRef != (v1alpha1.ObjectRef{Namespace: home, Name: "web"}) {
		t.Fatalf("Infra labels %v clusterRef %v", inf.Labels, inf.Spec.ClusterRef)
	}
	if inf.Spec.Record != nil || len(inf.OwnerReferences) != 0 {
		t.Fatalf("a cluster Infra has no record binding and no owner: %+v %v", inf.Spec.Record, inf.OwnerReferences)
	}
	if n := len(inf.Spec.Contracts); n != 2 {
		t.Fatalf("%d contracts", n)
	}
	var infras v1alpha1.InfraList
	if err := r.c.List(context.Background(), &infras); err != nil || len(infras.Items) != 1 {
		t.Fatalf("Infras: %d, %v", len(infras.Items), err)
	}

	for _, c := range []*v1alpha1.NodeClaim{a, b} {
		name := contractOf("web", c)
		var cc *v1alpha1.ComputeContract
		r.eventually("ComputeContract "+name, func() (bool, string) {
			got, ok := r.contract(name)
			cc = got
			return ok, "absent"
		})
		if ref := metav1.GetControllerOf(cc); ref == nil || ref.UID != inf.UID || ref.Kind != "Infra" {
			t.Fatalf("%s controller %v, want the Infra", name, ref)
		}
		if cc.Spec.ComputeKind != v1alpha1.ComputeKindNode || cc.Spec.OwnerDid != "did:plc:owner" || cc.Spec.NodeJoin == nil ||
			cc.Spec.NodeJoin.NodeName != c.Name || cc.Spec.NodeJoin.Server != server || cc.Spec.SecretsRef == nil ||
			cc.Spec.NodeJoin.BundleSecretRef == nil || cc.Spec.SecretsRef.Name != cc.Spec.NodeJoin.BundleSecretRef.Name ||
			// The node registers closed until the node host has nominated its pods.
			!slices.Equal(cc.Spec.NodeJoin.Taints, []string{v1alpha1.TaintNodeUnregistered + ":NoSchedule"}) {
			t.Fatalf("%s spec %+v (nodeJoin %+v)", name, cc.Spec, cc.Spec.NodeJoin)
		}
		// The claim's size is its contract's; a claim that states none leaves the default.
		if want := [2]int32{c.Spec.CPUs, c.Spec.MemMiB}; [2]int32{cc.Spec.CPUs, cc.Spec.MemMiB} != want {
			t.Fatalf("%s size %d CPU %d MiB, want the claim's %v", name, cc.Spec.CPUs, cc.Spec.MemMiB, want)
		}
		// The cluster's node requirement is the contract's.
		if cc.Spec.RequireIsolation != v1alpha1.IsolationVM || cc.Spec.RequireArch != "arm64" {
			t.Fatalf("%s requireIsolation %q, requireArch %q; want the cluster's vm, arm64", name, cc.Spec.RequireIsolation, cc.Spec.RequireArch)
		}
		if a := cc.Spec.PolicyArgs; a[market.ArgMaxCost] != "7" || a[market.ArgCurrency] != "USD" {
			t.Fatalf("%s policyArgs %v, want the cluster's maxCost 7 USD", name, a)
		}
		if w := cc.Spec.PolicyArgs[market.ArgBidWindow]; w != "1.5" {
			t.Fatalf("%s bid window %q, want the controller's 1.5 s", name, w)
		}
		var s corev1.Secret
		if !r.get(types.NamespacedName{Namespace: gateway, Name: cc.Spec.SecretsRef.Name}, &s) || len(s.Data[tenant.BundleKeyKubeconfig]) == 0 {
			t.Fatalf("join bundle %s: %v", cc.Spec.SecretsRef.Name, s.Data)
		}
		r.eventually(c.Name+" Bidding with status.infra", func() (bool, string) {
			got, _ := r.nodeClaim(c.Name)
			want := v1alpha1.NodeClaimInfra{Workspace: gateway, Name: inf.Name, Contract: infra.NodeEntryName(string(c.UID)), ComputeContract: name}
			return got.Status.Phase == v1alpha1.NodeClaimBidding && got.Status.Infra != nil && *got.Status.Infra == want,
				fmt.Sprintf("%s %+v", got.Status.Phase, got.Status.Infra)
		})
	}

	r.drive(contractOf("web", a), v1alpha1.ComputeContractHeld, false)
	r.drive(contractOf("web", b), v1alpha1.ComputeContractHeld, true)
	r.eventually("a Provisioning, b Joining", func() (bool, string) {
		ga, _ := r.nodeClaim("node-a")
		gb, _ := r.nodeClaim("node-b")
		return ga.Status.Phase == v1alpha1.NodeClaimProvisioning && gb.Status.Phase == v1alpha1.NodeClaimJoining, fmt.Sprintf("%s %s", ga.Status.Phase, gb.Status.Phase)
	})
	r.eventually("the Infra Deployed", func() (bool, string) {
		got, _ := r.infraOf("web")
		return got.Status.Phase == v1alpha1.InfraDeployed && got.Status.ContractsReady == "2/2", string(got.Status.Phase) + " " + got.Status.ContractsReady
	})
	r.nodes.ready.Store("node-b", true)
	r.eventually("b Running once its node is Ready", func() (bool, string) {
		gb, _ := r.nodeClaim("node-b")
		return gb.Status.Phase == v1alpha1.NodeClaimRunning && gb.Status.NodeName == "node-b" && gb.Status.JoinedAt != nil, string(gb.Status.Phase)
	})
}

// Deleting one of two claims: its entry goes Released, its contract is released; once the
// contract is Released the entry is dropped, the contract deleted, the bundle removed and the
// claim gone; the other entry, its contract and its claim keep their uid and phase. The last
// claim leaving deletes the Infra.
func TestNodeClaims_DrivenStatus_ScaleInOne(t *testing.T) {
	r := newRig(t, false)
	cl := r.cluster("web")
	cl.Status.Phase = v1alpha1.ClusterReady // a Ready cluster has its released nodes deleted
	if err := r.c.Status().Update(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	a, b := r.claim("node-a", "web"), r.claim("node-b", "web")
	ccA, ccB := contractOf("web", a), contractOf("web", b)
	for _, n := range []string{ccA, ccB} {
		r.eventually("ComputeContract "+n, func() (bool, string) { _, ok := r.contract(n); return ok, "absent" })
		r.drive(n, v1alpha1.ComputeContractHeld, true)
	}
	r.eventually("both Joining", func() (bool, string) {
		ga, _ := r.nodeClaim("node-a")
		gb, _ := r.nodeClaim("node-b")
		return ga.Status.Phase == v1alpha1.NodeClaimJoining && gb.Status.Phase == v1alpha1.NodeClaimJoining, fmt.Sprintf("%s %s", ga.Status.Phase, gb.Status.Phase)
	})
	before, _ := r.contract(ccB)
	inf0, _ := r.infraOf("web")
	entryB := infra.NodeEntryName(string(b.UID))
	specB, _ := infra.NodeEntryOf(inf0.Spec, entryB)

	if err := r.c.Delete(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	r.eventually("a's entry Released and its contract released", func() (bool, string) {
		inf, _ := r.infraOf("web")
		cc, _ := r.contract(ccA)
		return entryState(inf, infra.NodeEntryName(string(a.UID))) == v1alpha1.ContractReleased && cc.Spec.Release != nil,
			fmt.Sprintf("entry %s release %v", entryState(inf, infra.NodeEntryName(string(a.UID))), cc.Spec.Release)
	})
	if got, ok := r.nodeClaim("node-a"); !ok || got.DeletionTimestamp.IsZero() {
		t.Fatalf("claim a let go before its contract was released")
	}
	if r.nodes.wasDeleted("node-a") {
		t.Fatalf("node-a deleted from the tenant while its guest still runs")
	}
	// Its credentials are revoked from the claim's deletion on, before its guest is gone.
	r.eventually("node-a revoked", func() (bool, string) { return r.nodes.wasRevoked("node-a"), "not revoked" })
	if r.nodes.wasRevoked("node-b") {
		t.Fatal("node-b revoked with node-a")
	}
	r.drive(ccA, v1alpha1.ComputeContractReleased, false)
	r.eventually("a's entry dropped, contract, bundle and claim gone", func() (bool, string) {
		inf, _ := r.infraOf("web")
		_, hasEntry := infra.NodeEntryOf(inf.Spec, infra.NodeEntryName(string(a.UID)))
		_, hasCC := r.contract(ccA)
		_, hasClaim := r.nodeClaim("node-a")
		var s corev1.Secret
		hasBundle := r.get(types.NamespacedName{Namespace: gateway, Name: infra.NodeBundleSecretName(inf.Name, infra.NodeEntryName(string(a.UID)))}, &s)
		return !hasEntry && !hasCC && !hasClaim && !hasBundle, fmt.Sprintf("entry %v contract %v claim %v bundle %v", hasEntry, hasCC, hasClaim, hasBundle)
	})
	// The released node's time went into the owner's node-time ledger, so node-hours still
	// count it now that its claim is gone.
	gone, err := ledger.Read(context.Background(), r.c, "did:plc:owner")
	if err != nil {
		t.Fatal(err)
	}
	if iv, ok := gone[string(a.UID)]; !ok || !iv.From.Equal(a.CreationTimestamp.Time) || iv.To.Before(iv.From) {
		t.Errorf("the ledger after node-a's release: %v; want node-a's interval from its claim's creation", gone)
	}
	after, ok := r.contract(ccB)
	gb, okb := r.nodeClaim("node-b")
	inf1, _ := r.infraOf("web")
	specB1, _ := infra.NodeEntryOf(inf1.Spec, entryB)
	if !ok || after.UID != before.UID || after.Spec.Release != nil || !okb || gb.UID != b.UID || gb.Status.Phase != v1alpha1.NodeClaimJoining {
		t.Fatalf("b disturbed: contract %v (uid kept %v, release %v), claim %v phase %s", ok, after.UID == before.UID, after.Spec.Release, okb, gb.Status.Phase)
	}
	if !equality.Semantic.DeepEqual(specB, specB1) {
		t.Fatalf("b's entry changed: %+v -> %+v", specB, specB1)
	}
	if !r.nodes.wasDeleted("node-a") || r.nodes.wasDeleted("node-b") {
		t.Fatalf("nodes deleted from the tenant: node-a %v (want true), node-b %v (want false)", r.nodes.wasDeleted("node-a"), r.nodes.wasDeleted("node-b"))
	}

	if err := r.c.Delete(context.Background(), gb); err != nil {
		t.Fatal(err)
	}
	r.eventually("b's contract released", func() (bool, string) {
		cc, _ := r.contract(ccB)
		return cc.Spec.Release != nil, "no release"
	})
	r.drive(ccB, v1alpha1.ComputeContractReleased, false)
	r.eventually("the last entry dropped deletes the Infra", func() (bool, string) {
		_, hasInfra := r.infraOf("web")
		_, hasClaim := r.nodeClaim("node-b")
		_, hasCC := r.contract(ccB)
		return !hasInfra && !hasClaim && !hasCC, fmt.Sprintf("infra %v claim %v contract %v", hasInfra, hasClaim, hasCC)
	})
}

// Deleting the Cluster deletes its Infra, whose finalizer releases every node; once the
// contracts are Released the Infra is gone, and the claims, deleted afterwards, let go.
func TestNodeClaims_DrivenStatus_ClusterDelete(t *testing.T) {
	r := newRig(t, false)
	cl := r.cluster("web")
	a, b := r.claim("node-a", "web"), r.claim("node-b", "web")
	ccA, ccB := contractOf("web", a), contractOf("web", b)
	for _, n := range []string{ccA, ccB} {
		r.eventually("ComputeContract "+n, func() (bool, string) { _, ok := r.contract(n); return ok, "absent" })
		r.drive(n, v1alpha1.ComputeContractHeld, true)
	}
	if err := r.c.Delete(context.Background(), cl); err != nil {
		t.Fatal(err)
	}
	r.eventually("the Infra deleting and both contracts released", func() (bool, string) {
		inf, ok := r.infraOf("web")
		a, _ := r.contract(ccA)
		b, _ := r.contract(ccB)
		return ok && !inf.DeletionTimestamp.IsZero() && a.Spec.Release != nil && b.Spec.Release != nil,
			fmt.Sprintf("infra %v deleting %v", ok, ok && !inf.DeletionTimestamp.IsZero())
	})
	r.drive(ccA, v1alpha1.ComputeContractReleased, false)
	r.drive(ccB, v1alpha1.ComputeContractReleased, false)
	r.eventually("the Infra and its contracts gone", func() (bool, string) {
		_, hasInfra := r.infraOf("web")
		_, hasA := r.contract(ccA)
		_, hasB := r.contract(ccB)
		return !hasInfra && !hasA && !hasB, fmt.Sprintf("infra %v contracts %v %v", hasInfra, hasA, hasB)
	})
	r.eventually("the claims report Released", func() (bool, string) {
		ga, _ := r.nodeClaim("node-a")
		gb, _ := r.nodeClaim("node-b")
		return ga.Status.Phase == v1alpha1.NodeClaimReleased && gb.Status.Phase == v1alpha1.NodeClaimReleased, fmt.Sprintf("%s %s", ga.Status.Phase, gb.Status.Phase)
	})
	for _, c := range []*v1alpha1.NodeClaim{a, b} {
		if err := r.c.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	r.eventually("the claims gone, no Infra written again", func() (bool, string) {
		_, ha := r.nodeClaim("node-a")
		_, hb := r.nodeClaim("node-b")
		_, hi := r.infraOf("web")
		return !ha && !hb && !hi, fmt.Sprintf("claims %v %v infra %v", ha, hb, hi)
	})
}

// Many claims of one cluster reconciled at the same moment, each by its own reconciler call
// on its own goroutine: every entry is in the Infra afterwards (the per-Infra lock and the
// optimistic lock keep any write from dropping another claim's entry).
func TestNodeClaims_ConcurrentClaimsKeepEveryEntry(t *testing.T) {
	r := newRig(t, true)
	r.cluster("web")
	rec := &nodeclaim.Reconciler{Client: r.c, Bundler: pkiBundler{r.root}, Log: quiet()}
	const n = 12
	var claims []*v1alpha1.NodeClaim
	for i := 0; i < n; i++ {
		claims = append(claims, r.claim(fmt.Sprintf("node-%02d", i), "web"))
	}
	// Each claim is reconciled until it asks for nothing more, all claims at once.
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for _, c := range claims {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			<-start
			for i := 0; i < 10; i++ {
				res, err := rec.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: home, Name: name}})
				if err != nil {
					errs <- fmt.Errorf("%s: %w", name, err)
					return
				}
				if res.RequeueAfter == 0 {
					return
				}
			}
		}(c.Name)
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	inf, ok := r.infraOf("web")
	if !ok {
		t.Fatal("no Infra")
	}
	if len(inf.Spec.Contracts) != n || len(inf.Spec.Nodes) != n || len(inf.Spec.Secrets) != n {
		t.Fatalf("%d contracts, %d nodes, %d secrets; want %d each", len(inf.Spec.Contracts), len(inf.Spec.Nodes), len(inf.Spec.Secrets), n)
	}
	for _, c := range claims {
		if s := entryState(inf, infra.NodeEntryName(string(c.UID))); s != v1alpha1.ContractRequested {
			t.Errorf("entry of %s: %q", c.Name, s)
		}
	}

	// And the same for the release: every claim deleted at once, every entry Released and
	// none lost on the way.
	for _, c := range claims {
		if err := r.c.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	start = make(chan struct{})
	for _, c := range claims {
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			<-start
			if _, err := rec.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: home, Name: name}}); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}(c.Name)
	}
	close(start)
	wg.Wait()
	inf, _ = r.infraOf("web")
	for _, c := range claims {
		// No ComputeContract exists (no Infra controller runs here), so each claim finds its
		// contract gone, drops its entry and lets go; the last one deletes the Infra.
		if _, ok := r.nodeClaim(c.Name); ok {
			t.Errorf("claim %s still there", c.Name)
		}
	}
	if _, ok := r.infraOf("web"); ok {
		t.Fatalf("the Infra outlived its last entry: %d contracts", len(inf.Spec.Contracts))
	}
}

// The start-up resync drops entries whose claim is gone or was recreated, and deletes an
// Infra whose Cluster is gone.
func TestNodeClaims_ResyncDropsStaleEntriesAndOrphanInfras(t *testing.T) {
	r := newRig(t, true)
	r.cluster("web")
	rec := &nodeclaim.Reconciler{Client: r.c, Bundler: pkiBundler{r.root}, Log: quiet()}
	keep, gone := r.claim("keep", "web"), r.claim("gone", "web")
	for _, c := range []*v1alpha1.NodeClaim{keep, gone} {
		if _, err := rec.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: home, Name: c.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	// "gone" disappears while no controller runs: its finalizer removed by hand.
	gone, _ = r.nodeClaim("gone")
	gone.Finalizers = nil
	if err := r.c.Update(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	// An Infra of a cluster that no longer exists.
	orphan := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: gateway, Name: infra.ClusterInfraName(home, "old"),
		Labels: map[string]string{v1alpha1.LabelInfraCluster: "old"}},
		Spec: v1alpha1.InfraSpec{ClusterRef: &v1alpha1.ObjectRef{Namespace: home, Name: "old"}, Contracts: []v1alpha1.InfraContract{{Name: "node-000000000000"}}}}
	if err := r.c.Create(context.Background(), orphan); err != nil {
		t.Fatal(err)
	}

	if err := rec.Resync(context.Background()); err != nil {
		t.Fatal(err)
	}
	inf, ok := r.infraOf("web")
	if !ok {
		t.Fatal("the live cluster's Infra was deleted")
	}
	if _, has := infra.NodeEntryOf(inf.Spec, infra.NodeEntryName(string(gone.UID))); has {
		t.Error("the gone claim's entry survived the resync")
	}
	if s := entryState(inf, infra.NodeEntryName(string(keep.UID))); s != v1alpha1.ContractRequested {
		t.Errorf("the kept claim's entry is %q", s)
	}
	if _, ok := r.infraOf("old"); ok {
		t.Error("the Infra of a gone Cluster survived the resync")
	}
}

// Registered with every other controller in a process that runs no tenant control planes
// (as testenv and `socialweb controllers` do): a claim's entry is declared Staged, no
// ComputeContract is created, and the claim says why it waits.
func TestNodeClaims_NoTenantPlanesStaysStaged(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true})
	r := &rig{t: t, env: env, c: env.Client, root: t.TempDir()}
	r.cluster("web")
	c := r.claim("node-a", "web")
	r.eventually("a Staged entry and a Pending claim that says why", func() (bool, string) {
		inf, ok := r.infraOf("web")
		got, _ := r.nodeClaim("node-a")
		if !ok {
			return false, "no Infra"
		}
		s := entryState(inf, infra.NodeEntryName(string(c.UID)))
		return s == v1alpha1.ContractStaged && got.Status.Phase == v1alpha1.NodeClaimPending && got.Status.Message == nodeclaim.ErrNoBundler.Error(),
			fmt.Sprintf("entry %q claim %q %q", s, got.Status.Phase, got.Status.Message)
	})
	if _, ok := r.contract(contractOf("web", c)); ok {
		t.Fatal("a Staged entry has a ComputeContract")
	}
	if err := r.c.Delete(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	r.eventually("the claim gone and the Infra with it", func() (bool, string) {
		_, hc := r.nodeClaim("node-a")
		_, hi := r.infraOf("web")
		return !hc && !hi, fmt.Sprintf("claim %v infra %v", hc, hi)
	})
}

// What happened while no controller ran is swept up when the controllers start: an entry
// whose claim is gone is dropped (its Infra, left with no entry, is deleted) and an Infra
// whose Cluster is gone is deleted.
func TestNodeClaims_RestartResync(t *testing.T) {
	r := newRig(t, true)
	r.cluster("web")
	ctx := context.Background()
	stale := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: gateway, Name: infra.ClusterInfraName(home, "web"),
		Labels: map[string]string{v1alpha1.LabelInfraCluster: "web"}},
		Spec: infra.ComposeNodeEntry(v1alpha1.InfraSpec{}, infra.ClusterInfra{Cluster: v1alpha1.ObjectRef{Namespace: home, Name: "web"}}, infra.NodeEntryName("gone-uid"),
			&infra.NodeEntry{Name: infra.NodeEntryName("gone-uid"), State: v1alpha1.ContractStaged,
				Node: v1alpha1.InfraContractNode{NodeClaimRef: &v1alpha1.ObjectRef{Namespace: home, Name: "gone"}}})}
	orphan := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: gateway, Name: infra.ClusterInfraName(home, "old"),
		Labels: map[string]string{v1alpha1.LabelInfraCluster: "old"}},
		Spec: v1alpha1.InfraSpec{ClusterRef: &v1alpha1.ObjectRef{Namespace: home, Name: "old"}, Contracts: []v1alpha1.InfraContract{{Name: "node-000000000000"}}}}
	for _, o := range []*v1alpha1.Infra{stale, orphan} {
		if err := r.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r.start()
	r.eventually("both Infras gone", func() (bool, string) {
		_, hw := r.infraOf("web")
		_, ho := r.infraOf("old")
		return !hw && !ho, fmt.Sprintf("web %v old %v", hw, ho)
	})
}

// A contract that fails makes its claim Failed and the entry Released, with the node fields
// and bundle it was made with; deleting the claim then lets go at once, and the Infra goes
// with its last entry. A guest released without being asked makes its claim Lost.
func TestNodeClaims_DrivenStatus_FailedAndLost(t *testing.T) {
	r := newRig(t, false)
	r.cluster("web")
	a, b := r.claim("node-a", "web"), r.claim("node-b", "web")
	ccA, ccB := contractOf("web", a), contractOf("web", b)
	for _, n := range []string{ccA, ccB} {
		r.eventually("ComputeContract "+n, func() (bool, string) { _, ok := r.contract(n); return ok, "absent" })
	}
	r.drive(ccA, v1alpha1.ComputeContractFailed, false)
	r.drive(ccB, v1alpha1.ComputeContractHeld, true)
	r.drive(ccB, v1alpha1.ComputeContractReleased, false)
	r.eventually("a Failed, b Lost, both entries Released with their node fields", func() (bool, string) {
		ga, _ := r.nodeClaim("node-a")
		gb, _ := r.nodeClaim("node-b")
		inf, _ := r.infraOf("web")
		ea, _ := infra.NodeEntryOf(inf.Spec, infra.NodeEntryName(string(a.UID)))
		eb, _ := infra.NodeEntryOf(inf.Spec, infra.NodeEntryName(string(b.UID)))
		ok := ga.Status.Phase == v1alpha1.NodeClaimFailed && gb.Status.Phase == v1alpha1.NodeClaimLost &&
			ea != nil && ea.State == v1alpha1.ContractReleased && ea.Node.NodeJoin != nil && ea.Bundle != nil &&
			eb != nil && eb.State == v1alpha1.ContractReleased && eb.Node.NodeJoin != nil && eb.Bundle != nil
		return ok, fmt.Sprintf("%s %s %+v %+v", ga.Status.Phase, gb.Status.Phase, ea, eb)
	})
	for _, c := range []*v1alpha1.NodeClaim{a, b} {
		if err := r.c.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	r.eventually("the claims, contracts and Infra gone", func() (bool, string) {
		_, ha := r.nodeClaim("node-a")
		_, hb := r.nodeClaim("node-b")
		_, hca := r.contract(ccA)
		_, hcb := r.contract(ccB)
		_, hi := r.infraOf("web")
		return !ha && !hb && !hca && !hcb && !hi, fmt.Sprintf("claims %v %v contracts %v %v infra %v", ha, hb, hca, hcb, hi)
	})
}

// The join and loss graces: a node that never joins, and a joined node that stops reporting
// Ready, make their claims Lost past the grace, and Lost releases the entry (so the guest).
func TestNodeClaims_DrivenStatus_JoinAndLossGraces(t *testing.T) {
	r := newRig(t, true)
	r.graces = infra.NodeGraces{Join: 2 * time.Second, Loss: 2 * time.Second}
	r.start()
	r.cluster("web")
	a, b := r.claim("node-a", "web"), r.claim("node-b", "web")
	ccA, ccB := contractOf("web", a), contractOf("web", b)
	for _, n := range []string{ccA, ccB} {
		r.eventually("ComputeContract "+n, func() (bool, string) { _, ok := r.contract(n); return ok, "absent" })
	}
	r.nodes.ready.Store(b.Spec.NodeName, true)
	r.drive(ccA, v1alpha1.ComputeContractHeld, true)
	r.drive(ccB, v1alpha1.ComputeContractHeld, true)
	r.eventually("b Running", func() (bool, string) {
		gb, _ := r.nodeClaim("node-b")
		return gb.Status.Phase == v1alpha1.NodeClaimRunning, string(gb.Status.Phase)
	})
	r.eventually("a, whose node never joined, Lost past the join grace and its entry Released", func() (bool, string) {
		ga, _ := r.nodeClaim("node-a")
		inf, _ := r.infraOf("web")
		ok := ga.Status.Phase == v1alpha1.NodeClaimLost && strings.Contains(ga.Status.Message, "did not join") &&
			entryState(inf, infra.NodeEntryName(string(a.UID))) == v1alpha1.ContractReleased
		return ok, fmt.Sprintf("%s %q", ga.Status.Phase, ga.Status.Message)
	})
	if gb, _ := r.nodeClaim("node-b"); gb.Status.Phase != v1alpha1.NodeClaimRunning {
		t.Fatalf("b, whose node is Ready, is %s", gb.Status.Phase)
	}
	r.nodes.ready.Delete(b.Spec.NodeName)
	r.eventually("b, whose node stopped reporting Ready, Lost past the loss grace and its entry Released", func() (bool, string) {
		gb, _ := r.nodeClaim("node-b")
		inf, _ := r.infraOf("web")
		ok := gb.Status.Phase == v1alpha1.NodeClaimLost && strings.Contains(gb.Status.Message, "stopped reporting Ready") &&
			entryState(inf, infra.NodeEntryName(string(b.UID))) == v1alpha1.ContractReleased
		return ok, fmt.Sprintf("%s %q", gb.Status.Phase, gb.Status.Message)
	})
}
