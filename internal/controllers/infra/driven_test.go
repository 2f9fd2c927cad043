package infra_test

// The rows that need a guest (REQUEST-DEPLOY, DELETE-RELEASES, EPHEMERAL-END) run end to end
// with a real bidder in test/e2e/infra_market_test.go. These suites drive ComputeContract
// status from the test and call the reconciler directly against the real embedded core, with
// an injected clock for the ephemeral deadline (which no e2e row can wait for).

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	infractl "socialweb.computer/internal/controllers/infra"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/testenv"
)

const ns = "default"

type driver struct {
	t   *testing.T
	env *testenv.Env
	r   *infractl.Reconciler
	now time.Time
}

func newDriver(t *testing.T, kind infra.Kind) *driver {
	env := testenv.Start(t, testenv.Options{})
	d := &driver{t: t, env: env, now: time.Now()}
	d.r = &infractl.Reconciler{Kind: kind, Client: env.Client, Resolver: &repos.Resolver{Client: env.Client}, Now: func() time.Time { return d.now }}
	return d
}

// readAgain says whether a reconcile asked to read again at once (a conflict), not later.
func readAgain(res reconcile.Result) bool {
	return res.RequeueAfter > 0 && res.RequeueAfter <= reconcilekit.Soon
}

// reconcile runs the reconciler until it asks for nothing more (at most a few passes).
func (d *driver) reconcile(name string) reconcile.Result {
	d.t.Helper()
	var res reconcile.Result
	for i := 0; i < 4; i++ {
		var err error
		res, err = d.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
		if err != nil {
			d.t.Fatalf("reconcile %s: %v", name, err)
		}
		if !readAgain(res) {
			res, err = d.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
			if err != nil {
				d.t.Fatalf("reconcile %s: %v", name, err)
			}
			if !readAgain(res) {
				return res
			}
		}
	}
	return res
}

func (d *driver) infra(name string) *v1alpha1.Infra {
	d.t.Helper()
	var inf v1alpha1.Infra
	if err := d.env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &inf); err != nil {
		d.t.Fatalf("get %s: %v", name, err)
	}
	return &inf
}

func (d *driver) cc(name string) *v1alpha1.ComputeContract {
	var cc v1alpha1.ComputeContract
	if err := d.env.Client.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &cc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		d.t.Fatalf("get %s: %v", name, err)
	}
	return &cc
}

// setPhase drives a ComputeContract's status, as the market controller will.
func (d *driver) setPhase(name string, phase v1alpha1.ComputeContractPhase) {
	d.t.Helper()
	cc := d.cc(name)
	if cc == nil {
		d.t.Fatalf("ComputeContract %s does not exist", name)
	}
	cc.Status.Phase = phase
	if phase == v1alpha1.ComputeContractHeld {
		cc.Status.Winner = "did:plc:winner"
	}
	if err := d.env.Client.Status().Update(context.Background(), cc); err != nil {
		d.t.Fatalf("status of %s: %v", name, err)
	}
}

func phases(st []v1alpha1.InfraContractStatus) map[string]v1alpha1.InfraContractPhase {
	m := map[string]v1alpha1.InfraContractPhase{}
	for _, c := range st {
		m[c.Name] = c.Phase
	}
	return m
}

func TestInfraContracts_DrivenStatus_RequestDeployDeleteReleases(t *testing.T) {
	d := newDriver(t, infra.KindInfra)
	ctx := context.Background()
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns}, Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{
		{Name: "web", State: v1alpha1.ContractRequested, VMName: "web-vm"}, {Name: "db"},
	}}}
	if err := d.env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	d.reconcile("app")
	got := d.infra("app")
	cc := d.cc("infra-app-web")
	if cc == nil || d.cc("infra-app-db") != nil {
		t.Fatalf("want a ComputeContract for web only")
	}
	if cc.Labels[v1alpha1.LabelInfraKind] != "Infra" || cc.Labels[v1alpha1.LabelInfraName] != "app" || cc.Labels[v1alpha1.LabelInfraContract] != "web" ||
		metav1.GetControllerOf(cc) == nil || metav1.GetControllerOf(cc).UID != got.UID || cc.Spec.VMName != "web-vm" {
		t.Fatalf("ComputeContract %+v", cc.ObjectMeta)
	}
	if p := phases(got.Status.Contracts); p["web"] != v1alpha1.InfraContractRequesting || p["db"] != v1alpha1.InfraContractStaged ||
		got.Status.Phase != v1alpha1.InfraDeploying || got.Status.ContractsReady != "0/1" {
		t.Fatalf("status %+v", got.Status)
	}

	d.setPhase("infra-app-web", v1alpha1.ComputeContractHeld)
	d.reconcile("app")
	got = d.infra("app")
	if got.Status.Phase != v1alpha1.InfraDeployed || got.Status.ContractsReady != "1/1" || got.Status.Contracts[0].Winner != "did:plc:winner" {
		t.Fatalf("after Held: %+v", got.Status)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, "Ready"); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("Ready %+v", c)
	}

	// Deleting releases first and waits for the release.
	if err := d.env.Client.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	d.reconcile("app")
	got = d.infra("app")
	if cc = d.cc("infra-app-web"); cc.Spec.Release == nil || cc.Spec.Release.Reason != infra.ReleaseDeleted {
		t.Fatalf("release not set: %+v", cc.Spec.Release)
	}
	if got.Status.Phase != v1alpha1.InfraDeleting {
		t.Fatalf("phase %s, want Deleting", got.Status.Phase)
	}
	d.setPhase("infra-app-web", v1alpha1.ComputeContractReleasing)
	d.reconcile("app")
	if d.cc("infra-app-web") == nil || d.infra("app") == nil {
		t.Fatal("let go before the release finished")
	}
	d.setPhase("infra-app-web", v1alpha1.ComputeContractReleased)
	d.reconcile("app")
	if d.cc("infra-app-web") != nil {
		t.Fatal("released ComputeContract not deleted")
	}
	var gone v1alpha1.Infra
	if err := d.env.Client.Get(ctx, client.ObjectKeyFromObject(inf), &gone); !apierrors.IsNotFound(err) {
		t.Fatalf("object still there after every contract was released: %v %v", err, gone.Finalizers)
	}
}

func TestInfraContracts_DrivenStatus_DroppedAndRestaged(t *testing.T) {
	d := newDriver(t, infra.KindInfra)
	ctx := context.Background()
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: ns}, Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{
		{Name: "a", State: v1alpha1.ContractRequested}, {Name: "b", State: v1alpha1.ContractRequested},
	}}}
	if err := d.env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	d.reconcile("app")
	d.setPhase("infra-app-a", v1alpha1.ComputeContractHeld)
	d.setPhase("infra-app-b", v1alpha1.ComputeContractFailed)
	d.reconcile("app")
	if got := d.infra("app"); got.Status.Phase != v1alpha1.InfraDegraded {
		t.Fatalf("phase %s, want Degraded", got.Status.Phase)
	}

	// Drop a, move b back to Staged.
	got := d.infra("app")
	got.Spec.Contracts = []v1alpha1.InfraContract{{Name: "b", State: v1alpha1.ContractStaged}}
	if err := d.env.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	d.reconcile("app")
	if cc := d.cc("infra-app-a"); cc == nil || cc.Spec.Release == nil || cc.Spec.Release.Reason != infra.ReleaseRemoved {
		t.Fatalf("dropped contract not released: %+v", cc)
	}
	if d.cc("infra-app-b") != nil {
		t.Fatal("the finished ComputeContract of a restaged contract is kept")
	}
	d.setPhase("infra-app-a", v1alpha1.ComputeContractReleased)
	d.reconcile("app")
	if d.cc("infra-app-a") != nil {
		t.Fatal("the dropped contract's ComputeContract is kept after Released")
	}
	if got := d.infra("app"); got.Status.Phase != v1alpha1.InfraStaged {
		t.Fatalf("phase %s, want Staged", got.Status.Phase)
	}

	// Requested again starts a new ComputeContract.
	got = d.infra("app")
	got.Spec.Contracts[0].State = v1alpha1.ContractRequested
	if err := d.env.Client.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	d.reconcile("app")
	if cc := d.cc("infra-app-b"); cc == nil || cc.Status.Phase != "" {
		t.Fatalf("no fresh ComputeContract for b: %+v", cc)
	}
}

// EPHEMERAL-END through an injected clock: the deadline is a requeue at expiresAt; at it,
// every contract is released, the phase is Ending, then Ended once all finished, and the
// object deletes itself.
func TestEphemeralInfra_DrivenStatus_DeadlineEnd(t *testing.T) {
	d := newDriver(t, infra.KindEphemeralInfra)
	ctx := context.Background()
	e := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: ns}, Spec: v1alpha1.EphemeralInfraSpec{
		TTLSeconds: 60, EndWhen: v1alpha1.EndWhenDeadline,
		InfraSpec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "run", State: v1alpha1.ContractRequested}}}}}
	if err := d.env.Client.Create(ctx, e); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.EphemeralInfra
	_ = d.env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got)
	d.now = got.CreationTimestamp.Add(10 * time.Second)
	res := d.reconcile("job")
	if res.RequeueAfter != 50*time.Second {
		t.Fatalf("requeue after %s, want 50s (the deadline)", res.RequeueAfter)
	}
	_ = d.env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got)
	if got.Status.ExpiresAt == nil || !got.Status.ExpiresAt.Time.Equal(got.CreationTimestamp.Add(60*time.Second)) || got.Status.EndedAt != nil {
		t.Fatalf("status %+v", got.Status)
	}
	d.setPhase("einfra-job-run", v1alpha1.ComputeContractHeld)

	d.now = got.CreationTimestamp.Add(61 * time.Second)
	res = d.reconcile("job")
	_ = d.env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got)
	if got.Status.EndReason != infra.EndReasonDeadline || got.Status.EndedAt == nil || got.Status.Phase != v1alpha1.InfraEnding || res.RequeueAfter != 0 {
		t.Fatalf("at the deadline: %+v (requeue %s)", got.Status, res.RequeueAfter)
	}
	if cc := d.cc("einfra-job-run"); cc.Spec.Release == nil || cc.Spec.Release.Reason != infra.ReleaseEnded {
		t.Fatalf("not released at the end: %+v", cc.Spec.Release)
	}
	d.setPhase("einfra-job-run", v1alpha1.ComputeContractReleased)
	d.reconcile("job")
	d.reconcile("job")
	if err := d.env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got); !apierrors.IsNotFound(err) {
		t.Fatalf("ended EphemeralInfra not deleted: %v %+v", err, got.Status)
	}
	if d.cc("einfra-job-run") != nil {
		t.Fatal("ComputeContract left behind")
	}
}

// endWhen Complete: once every requested contract finished, the deployment ends (Complete)
// before its deadline.
func TestEphemeralInfra_DrivenStatus_CompleteEnd(t *testing.T) {
	d := newDriver(t, infra.KindEphemeralInfra)
	ctx := context.Background()
	e := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: ns}, Spec: v1alpha1.EphemeralInfraSpec{
		TTLSeconds: 3600, InfraSpec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "run", State: v1alpha1.ContractRequested}, {Name: "idle"}}}}}
	if err := d.env.Client.Create(ctx, e); err != nil {
		t.Fatal(err)
	}
	d.reconcile("job")
	d.setPhase("einfra-job-run", v1alpha1.ComputeContractHeld)
	d.reconcile("job")
	d.setPhase("einfra-job-run", v1alpha1.ComputeContractReleased)
	d.reconcile("job") // observes Released
	d.reconcile("job") // ends: Complete, Ended, deletes itself
	d.reconcile("job") // finalizer
	var got v1alpha1.EphemeralInfra
	if err := d.env.Client.Get(ctx, client.ObjectKeyFromObject(e), &got); !apierrors.IsNotFound(err) {
		t.Fatalf("complete EphemeralInfra not deleted: %v %+v", err, got.Status)
	}
}
