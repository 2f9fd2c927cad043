package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
	"socialweb.computer/internal/workspace"
)

// leftInNamespace lists every object of our group left in ns, as Kind/name.
func leftInNamespace(t *testing.T, env *testenv.Env) []string {
	t.Helper()
	var left []string
	for _, k := range workspace.Kinds(manager.Scheme()) {
		l := &metav1.PartialObjectMetadataList{}
		gvk := workspace.GroupVersionKind(k)
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(k + "List"))
		if err := env.Client.List(context.Background(), l, client.InNamespace(ns)); err != nil {
			t.Fatalf("list %s: %v", k, err)
		}
		for _, it := range l.Items {
			left = append(left, k+"/"+it.Name)
		}
	}
	return left
}

// `socialweb workspace delete` on a workspace with a Held contract and an Infra bound to a
// record whose requested contract is deployed (two running deno guests), and a Secret: it reports the deployments
// releasing, exits 0, and leaves no object of ours and no guest process.
func TestACC_WorkspaceDelete(t *testing.T) {
	env := marketEnv(t)
	b := startBidder(t, env, "wsbidder.test", 5)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: ns}, Data: map[string][]byte{"k": []byte("v")}}
	if err := env.Client.Create(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	newContract(t, env, "c1")
	waitContract(t, env, "c1", v1alpha1.ComputeContractHeld)
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: v1alpha1.InfraSpec{Description: "to be deleted", Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "owner"}},
			Contracts: []v1alpha1.InfraContract{{Name: "api", State: v1alpha1.ContractRequested, ComputeKind: "deno", UserData: foreverGuest}}}}
	if err := env.Client.Create(context.Background(), inf); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the Infra's contract and record child", func() (bool, error) {
		l := leftInNamespace(t, env)
		s := strings.Join(l, " ")
		return strings.Contains(s, "ComputeContract/infra-") && strings.Contains(s, "AtprotoRecord/"), errors.New(s)
	})
	// Both contracts hold a guest: the bare one and the Infra's (run from its record's repo).
	testenv.Eventually(t, 30*time.Second, "two guests running", func() (bool, error) {
		n := running(t, b)
		return n == 2, fmt.Errorf("%d guest(s) running, left: %v", n, leftInNamespace(t, env))
	})

	out, code := runCLI(t, "workspace", "delete", ns, "--kubeconfig", env.Core.KubeconfigPath, "--timeout", "50s")
	if code != 0 {
		t.Fatalf("exit %d:\n%s\nleft: %v", code, out, leftInNamespace(t, env))
	}
	if !strings.Contains(out, "1 deployment(s) releasing") || !strings.Contains(out, "workspace "+ns+" deleted") {
		t.Fatalf("output:\n%s", out)
	}
	if i, j := strings.Index(out, "deployment(s) releasing"), strings.Index(out, "contract(s) releasing"); j >= 0 && j < i {
		t.Fatalf("contracts before deployments:\n%s", out)
	}
	if left := leftInNamespace(t, env); len(left) != 0 {
		t.Fatalf("left after the delete: %v\n%s", left, out)
	}
	if pids := substratetest.Procs(b.stateDir); len(pids) != 0 {
		t.Fatalf("guest processes left: %v", pids)
	}
}

// With no controller to run the finalizers the deletion stops at its timeout and names what
// is left and which finalizer holds it.
func TestACC_WorkspaceDeleteTimeoutNamesWhatIsLeft(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	c := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Name: "stuck", Namespace: ns,
		Finalizers: []string{v1alpha1.FinalizerComputeContractRelease}}, Spec: v1alpha1.ComputeContractSpec{VMName: "stuck"}}
	if err := env.Client.Create(ctx, c); err != nil {
		t.Fatal(err)
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s1", Namespace: ns}}
	if err := env.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	var progress strings.Builder
	err := workspace.Delete(dctx, env.Client, manager.Scheme(), ns, workspace.Options{Progress: &progress})
	var te *workspace.TimeoutError
	if !errors.As(err, &te) || te.Step != workspace.StepContracts {
		t.Fatalf("err %v, want a TimeoutError in step contracts", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "ComputeContract/stuck (deleting, finalizers ["+v1alpha1.FinalizerComputeContractRelease+"])") ||
		!strings.Contains(msg, "Secret/s1") {
		t.Fatalf("error does not name what is left: %s", msg)
	}
	if !strings.Contains(progress.String(), "1 contract(s) releasing") {
		t.Fatalf("progress: %q", progress.String())
	}
	// The Secret is kept: the contracts' release may still need it.
	if err := env.Client.Get(ctx, key("s1"), sec); err != nil {
		t.Fatalf("secret deleted before the contracts went: %v", err)
	}
	for _, args := range [][]string{{""}, {"Bad_Name"}, {}, {"a", "b"}, {"default", "--timeout", "0s"}} {
		out, code := runCLI(t, append([]string{"workspace", "delete", "--kubeconfig", env.Core.KubeconfigPath}, args...)...)
		if code == 0 || strings.Count(strings.TrimSpace(out), "\n") != 0 || strings.Contains(out, "panic") {
			t.Fatalf("workspace delete %q: exit %d, output %q", args, code, out)
		}
	}
}
