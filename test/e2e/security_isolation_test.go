package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// Against a running up with its two local bidders: each offering record states the
// isolation its substrate applies (docs/security.md, "Isolation in offerings"); a deno
// contract that requires a vm boundary is not won by up's deno bidder, whose boundary is
// less: the bid is refused with a reason naming the requirement, the contract ends Failed
// and no guest boots. The same contract without the requirement is Held by that bidder.
func TestSecurity_IsolationInOfferings(t *testing.T) {
	t.Parallel()
	requireNodeHost(t) // up runs its node bidder only as root on a host with the node prerequisites
	dir := filepath.Join(t.TempDir(), "data")
	denoGuests := filepath.Join(dir, "bidder", "guests")
	up := startUp(t, dir)
	pdsURL := up.phase(t, "PDS serving at ")
	denoBidder := up.phase(t, "local bidder "+app.LocalBidderHandle)
	nodeBidder := up.phase(t, "local bidder "+app.LocalNodeBidderHandle)
	ctx := context.Background()

	// The offering records, read back from the PDS as any requester reads them.
	pc := atclient.New(pdsURL)
	for _, row := range []struct {
		bidder string
		want   mk.OfferingIsolation
	}{
		{denoBidder, mk.OfferingIsolation{Substrate: "deno", Boundary: "namespace", Layers: []string{"mount-namespace", "pid-namespace", "seccomp", "cgroup-limits", "no-new-privs", "deno-permissions"}}},
		// The node runtime beside the binary runs pods in user namespaces of their own.
		{nodeBidder, mk.OfferingIsolation{Substrate: "node", Boundary: "namespace", Layers: []string{"network-namespace", "mount-namespace", "pid-namespace", "seccomp", "cgroup-limits", "pod-user-namespaces"}}},
	} {
		var off *mk.Offering
		testenv.Eventually(t, 10*time.Second, "offering of "+row.bidder, func() (bool, error) {
			rec, err := pc.GetRecord(ctx, row.bidder, mk.OfferingNSID, "self")
			if err != nil {
				return false, err
			}
			off, err = mk.DecodeOffering(rec.Value)
			return err == nil, err
		})
		if len(off.Isolation) != 1 {
			t.Errorf("offering of %s: isolation %+v, want one entry %+v", row.bidder, off.Isolation, row.want)
			continue
		}
		got := off.Isolation[0]
		if got.Substrate != row.want.Substrate || got.Boundary != row.want.Boundary || !slices.Equal(got.Layers, row.want.Layers) {
			t.Errorf("offering of %s states %+v, want %+v", row.bidder, got, row.want)
		}
		if !slices.Equal(off.Architectures, []string{runtime.GOARCH}) {
			t.Errorf("offering of %s states architectures %v, want this host's [%s]", row.bidder, off.Architectures, runtime.GOARCH)
		}
	}

	c := coreClient(t, dir)
	repo := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "owner"},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: app.DefaultHandle}}}
	if err := c.Create(ctx, repo); err != nil {
		t.Fatal(err)
	}
	contract := func(name string, require v1alpha1.IsolationBoundary, arch string) *v1alpha1.ComputeContract {
		cc := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, RequireIsolation: require, RequireArch: arch,
				UserData: `console.log("up"); setInterval(() => {}, 1000);`, RepoRef: &v1alpha1.ObjectRef{Name: "owner"},
				PolicyArgs: map[string]string{"bidWindowSec": "3", "answerTimeoutSec": "20"}}}
		if err := c.Create(ctx, cc); err != nil {
			t.Fatal(err)
		}
		// Deleted and gone before up stops: its finalizer releases the guest, which would
		// otherwise outlive up (guests survive their bidder's restarts).
		t.Cleanup(func() {
			if err := c.Delete(context.Background(), cc); client.IgnoreNotFound(err) != nil {
				t.Error(err)
				return
			}
			testenv.Eventually(t, 60*time.Second, "ComputeContract "+cc.Name+" released and gone", func() (bool, error) {
				err := c.Get(context.Background(), client.ObjectKeyFromObject(cc), &v1alpha1.ComputeContract{})
				return apierrors.IsNotFound(err), err
			})
		})
		return cc
	}
	wait := func(name string, phases ...v1alpha1.ComputeContractPhase) v1alpha1.ComputeContract {
		t.Helper()
		var got v1alpha1.ComputeContract
		testenv.Eventually(t, 60*time.Second, fmt.Sprintf("ComputeContract %s in %v", name, phases), func() (bool, error) {
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &got); err != nil {
				return false, err
			}
			return slices.Contains(phases, got.Status.Phase), nil
		})
		return got
	}

	// Required vm: the deno bidder states process for deno guests. It still bids (it does
	// not read the requirement); the requester refuses the bid at the window's deadline.
	strict := contract("strict", v1alpha1.IsolationVM, "")
	got := wait(strict.Name, v1alpha1.ComputeContractFailed, v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractReleased)
	if got.Status.Phase != v1alpha1.ComputeContractFailed || got.Status.Winner != "" {
		t.Fatalf("strict: phase %s winner %q message %q; want Failed with no winner", got.Status.Phase, got.Status.Winner, got.Status.Message)
	}
	t.Logf("strict: %s; bids %+v", got.Status.Message, got.Status.Bids)
	if !strings.Contains(got.Status.Message, "requireIsolation vm") {
		t.Errorf("strict: message %q does not name the requirement", got.Status.Message)
	}
	refused := false
	for _, b := range got.Status.Bids {
		if b.Bidder == denoBidder {
			refused = strings.Contains(b.Refused, "requireIsolation vm") && strings.Contains(b.Refused, "namespace")
			if !refused {
				t.Errorf("strict: the deno bidder's bid is refused with %q; want the requirement and its stated boundary", b.Refused)
			}
		}
	}
	if !refused && !strings.HasPrefix(got.Status.Message, "NoBids") {
		t.Errorf("strict: neither a refused bid from %s nor NoBids: bids %+v, message %q", denoBidder, got.Status.Bids, got.Status.Message)
	}
	if pids := substratetest.Procs(denoGuests); len(pids) != 0 {
		t.Fatalf("strict: a guest runs although no bidder meets the requirement: pids %v", pids)
	}

	// Without the requirement the same bidder wins and the guest runs.
	plain := contract("plain", "", "")
	got = wait(plain.Name, v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractFailed, v1alpha1.ComputeContractReleased)
	if got.Status.Phase != v1alpha1.ComputeContractHeld || got.Status.Winner != denoBidder {
		t.Fatalf("plain: phase %s winner %q message %q; want Held by %s", got.Status.Phase, got.Status.Winner, got.Status.Message, denoBidder)
	}
	if len(substratetest.Procs(denoGuests)) == 0 {
		t.Error("plain: Held but no guest process")
	}

	// Required another architecture than this host's: the bidder states its own, and its bid
	// is refused as the isolation one was.
	other := map[string]string{"amd64": "arm64"}[runtime.GOARCH]
	if other == "" {
		other = "amd64"
	}
	foreign := contract("foreign", "", other)
	got = wait(foreign.Name, v1alpha1.ComputeContractFailed, v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractReleased)
	if got.Status.Phase != v1alpha1.ComputeContractFailed || !strings.Contains(got.Status.Message, "requireArch "+other) {
		t.Errorf("foreign: phase %s winner %q message %q; want Failed naming requireArch %s", got.Status.Phase, got.Status.Winner, got.Status.Message, other)
	}
	for _, b := range got.Status.Bids {
		if b.Bidder == denoBidder && !strings.Contains(b.Refused, "requireArch "+other+": the bidder's offering states "+runtime.GOARCH) {
			t.Errorf("foreign: the deno bidder's bid is refused with %q; want the requirement and its stated architecture", b.Refused)
		}
	}

	// A requirement the API does not know is refused at the door, not dropped.
	bad := &v1alpha1.ComputeContract{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bad"},
		Spec: v1alpha1.ComputeContractSpec{ComputeKind: v1alpha1.ComputeKindDeno, RequireIsolation: "process", RepoRef: &v1alpha1.ObjectRef{Name: "owner"}}}
	if err := c.Create(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "requireIsolation") {
		t.Errorf("requireIsolation process: %v, want Invalid naming the field", err)
	}

	// An Infra contract's requirement reaches the ComputeContract it composes, and holds there.
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "iso"},
		Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "api", State: v1alpha1.ContractRequested,
			ComputeKind: v1alpha1.ComputeKindDeno, RequireIsolation: v1alpha1.IsolationVM, UserData: `setInterval(() => {}, 1000);`,
			PolicyArgs: map[string]string{"bidWindowSec": "3"}}},
			Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "owner"}}}}
	if err := c.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	ccName := infra.ContractName(infra.KindInfra, "iso", "api")
	got = wait(ccName, v1alpha1.ComputeContractFailed, v1alpha1.ComputeContractHeld, v1alpha1.ComputeContractReleased)
	if got.Spec.RequireIsolation != v1alpha1.IsolationVM || got.Status.Phase != v1alpha1.ComputeContractFailed || !strings.Contains(got.Status.Message, "requireIsolation vm") {
		t.Errorf("infra contract: requireIsolation %q, phase %s, message %q; want vm, Failed naming it", got.Spec.RequireIsolation, got.Status.Phase, got.Status.Message)
	}
	if err := c.Delete(ctx, inf); err != nil {
		t.Fatal(err)
	}

	for _, cc := range []*v1alpha1.ComputeContract{strict, plain, foreign} {
		if err := c.Delete(ctx, cc); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, 60*time.Second, "contracts and infra gone and no deno guest left", func() (bool, error) {
		var l v1alpha1.ComputeContractList
		if err := c.List(ctx, &l, client.InNamespace("default")); err != nil {
			return false, err
		}
		var il v1alpha1.InfraList
		if err := c.List(ctx, &il, client.InNamespace("default")); err != nil {
			return false, err
		}
		return len(l.Items) == 0 && len(il.Items) == 0 && len(substratetest.Procs(denoGuests)) == 0, nil
	})
}
