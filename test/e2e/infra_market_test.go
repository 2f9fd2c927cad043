package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/testenv"
)

// The ACC29 rows that need a guest: Infra and EphemeralInfra through the market, with real
// bidders and deno guests.

const ephemeralInfraNSID = "computer.socialweb.ephemeralInfra"

// denoContract is a declared deno contract running userData, in state.
func denoContract(name string, state v1alpha1.ContractState, userData string) v1alpha1.InfraContract {
	return v1alpha1.InfraContract{Name: name, State: state, ComputeKind: v1alpha1.ComputeKindDeno, UserData: userData,
		PolicyArgs: map[string]string{"bidWindowSec": "5", "answerTimeoutSec": "10"}}
}

// pdsRecord reads the record at rkey of coll straight from the PDS; nil when absent.
func pdsRecord(t *testing.T, env *testenv.Env, coll, rkey string) *atinfra.Infra {
	t.Helper()
	rec, err := env.PDS.Repo(env.Account.DID).Get(context.Background(), coll, rkey)
	if err != nil {
		return nil
	}
	if coll == ephemeralInfraNSID {
		var e atinfra.EphemeralInfra
		if err := json.Unmarshal(rec.Value, &e); err != nil {
			t.Fatalf("record %s/%s: %v (%s)", coll, rkey, err, rec.Value)
		}
		// The parts both kinds share.
		return &atinfra.Infra{Contracts: e.Contracts, CreatedAt: e.CreatedAt, Description: e.Description, Status: e.Status}
	}
	var v atinfra.Infra
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		t.Fatalf("record %s/%s: %v (%s)", coll, rkey, err, rec.Value)
	}
	return &v
}

func recordContract(rec *atinfra.Infra, name string) *atinfra.InfraContractStatus {
	if rec == nil || rec.Status == nil {
		return nil
	}
	for i := range rec.Status.Contracts {
		if rec.Status.Contracts[i].Name == name {
			return &rec.Status.Contracts[i]
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// deployInfra creates the Infra web with a staged deno contract api, moves api to Requested,
// and waits until the Infra is Deployed with b as the winner and its record says so.
func deployInfra(t *testing.T, env *testenv.Env, b *runningBidder, mut ...func(*v1alpha1.InfraContract)) *v1alpha1.Infra {
	t.Helper()
	newInfra(t, env, "web", "a deno api", nil, func(inf *v1alpha1.Infra) {
		c := denoContract("api", v1alpha1.ContractStaged, foreverGuest)
		for _, m := range mut {
			m(&c)
		}
		inf.Spec.Contracts = []v1alpha1.InfraContract{c}
	})
	waitInfra(t, env, "web", "staged and in sync", func(inf *v1alpha1.Infra) bool {
		return inf.Status.Phase == v1alpha1.InfraStaged && inSync(v1alpha1.RecordInSync)(inf)
	})
	editInfra(t, env, "web", func(inf *v1alpha1.Infra) { inf.Spec.Contracts[0].State = v1alpha1.ContractRequested })

	ccName := infra.ContractName(infra.KindInfra, "web", "api")
	cc := waitContract(t, env, ccName, v1alpha1.ComputeContractHeld)
	if ref := metav1.GetControllerOf(cc); ref == nil || ref.Kind != "Infra" || ref.Name != "web" {
		t.Fatalf("ComputeContract owner %v, want the Infra web", cc.OwnerReferences)
	}
	if cc.Status.Winner != b.DID() {
		t.Fatalf("winner %s, want %s", cc.Status.Winner, b.DID())
	}
	if n := running(t, b); n != 1 {
		t.Fatalf("%d guests running, want 1", n)
	}
	inf := waitInfra(t, env, "web", "Deployed with the winner", func(inf *v1alpha1.Infra) bool {
		return inf.Status.Phase == v1alpha1.InfraDeployed && len(inf.Status.Contracts) == 1 &&
			inf.Status.Contracts[0].Phase == v1alpha1.InfraContractDeployed && inf.Status.Contracts[0].Winner == b.DID() &&
			inf.Status.ContractsReady == "1/1" && inf.Status.ContractsByPhase == "1 Deployed"
	})
	// What kubectl prints: the contracts by phase and the winner, at a glance.
	if row := infraRow(t, env, "web"); len(row) < 6 || !slices.Equal(row[1:6], []string{"Deployed", "1/1", "1", "Deployed", b.DID()}) {
		t.Errorf("kubectl get infra web: %q, want PHASE Deployed, READY 1/1, CONTRACTS 1 Deployed, WINNER %s", row, b.DID())
	}
	testenv.Eventually(t, 30*time.Second, "the record says deployed with the winner", func() (bool, error) {
		rec := pdsRecord(t, env, infraNSID, "web")
		c := recordContract(rec, "api")
		if c == nil {
			return false, fmt.Errorf("record %s", statusJSON(rec))
		}
		return deref(rec.Status.Phase) == "deployed" && deref(c.Phase) == "deployed" && deref(c.Winner) == b.DID() &&
			len(rec.Contracts) == 1 && rec.Contracts[0].State == "requested", fmt.Errorf("record %s", statusJSON(rec))
	})
	return inf
}

// ACC29 REQUEST-DEPLOY: moving a staged contract to Requested creates its ComputeContract,
// owned by the Infra; a bidder wins and runs a deno guest; the Infra reports Deployed with
// the winner, and so does its record. The contract declares a port: the ComputeContract's
// status.guest says where it is forwarded, and the guest answers there.
func TestACC29_RequestDeploy(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	b := startBidder(t, env, "bidder1.test", 5)
	deployInfra(t, env, b, func(c *v1alpha1.InfraContract) {
		c.UserData = httpGuest
		c.Ports = []v1alpha1.ContractPort{{Name: "http", Port: 8080}}
	})
	if rec := pdsRecord(t, env, infraNSID, "web"); len(rec.Contracts[0].Ports) != 1 || rec.Contracts[0].Ports[0].Port != 8080 {
		t.Fatalf("record contract %s, want the port declared", statusJSON(rec.Contracts[0]))
	}
	ccName := infra.ContractName(infra.KindInfra, "web", "api")
	var g *v1alpha1.GuestStatus
	testenv.Eventually(t, 10*time.Second, "guest ports in the ComputeContract", func() (bool, error) {
		var cc v1alpha1.ComputeContract
		if err := env.Client.Get(ctx, key(ccName), &cc); err != nil {
			return false, err
		}
		g = cc.Status.Guest
		return g != nil && len(g.Ports) == 1 && g.Ports[0].Name == "http" && g.Ports[0].GuestPort == 8080 && g.Ports[0].HostPort > 0,
			fmt.Errorf("guest %+v", g)
	})
	url := fmt.Sprintf("http://%s:%d/", g.Address, g.Ports[0].HostPort)
	waitGuestAnswers(t, url, 10*time.Second)

	// Back to Released: the guest goes, the deployment reports Released.
	editInfra(t, env, "web", func(inf *v1alpha1.Infra) { inf.Spec.Contracts[0].State = v1alpha1.ContractReleased })
	waitInfra(t, env, "web", "Released", func(inf *v1alpha1.Infra) bool { return inf.Status.Phase == v1alpha1.InfraReleased })
	waitNoProcs(t, b.stateDir)
}

// ACC29 DELETE-RELEASES: deleting a deployed Infra releases its contract (the guest stops),
// deletes the ComputeContract, writes the record's end (endReason deleted), then goes.
func TestACC29_DeleteReleases(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	b := startBidder(t, env, "bidder1.test", 5)
	inf := deployInfra(t, env, b)
	ccName := infra.ContractName(infra.KindInfra, "web", "api")

	if err := env.Client.Delete(ctx, inf); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the Infra gone", func() (bool, error) {
		err := env.Client.Get(ctx, key("web"), &v1alpha1.Infra{})
		return apierrors.IsNotFound(err), err
	})
	if err := env.Client.Get(ctx, key(ccName), &v1alpha1.ComputeContract{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ComputeContract %s left: %v", ccName, err)
	}
	waitNoProcs(t, b.stateDir)
	if n := running(t, b); n != 0 {
		t.Fatalf("%d guests running after the delete", n)
	}
	rec := pdsRecord(t, env, infraNSID, "web")
	if rec == nil || rec.Status == nil || deref(rec.Status.Phase) != "ended" || deref(rec.Status.EndReason) != "deleted" {
		t.Fatalf("record %s, want phase ended, endReason deleted", statusJSON(rec))
	}
	if c := recordContract(rec, "api"); c == nil || deref(c.Phase) != "released" {
		t.Fatalf("record contract %s, want released", statusJSON(c))
	}
}

// ACC29 EPHEMERAL-END (by completion): an EphemeralInfra with endWhen Complete whose guest
// exits by itself: the contract is Released, the deployment ends (endReason complete),
// releases and deletes itself; its record keeps the end.
func TestACC29_EphemeralEnd(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	b := startBidder(t, env, "bidder1.test", 5)
	const short = `await new Promise((r) => setTimeout(r, 1500)); console.log("done");`
	e := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "job", Namespace: ns},
		Spec: v1alpha1.EphemeralInfraSpec{TTLSeconds: 600, EndWhen: v1alpha1.EndWhenComplete,
			InfraSpec: v1alpha1.InfraSpec{Description: "a job that ends",
				Contracts: []v1alpha1.InfraContract{denoContract("run", v1alpha1.ContractRequested, short)},
				Record:    &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}}}}}
	if err := env.Client.Create(ctx, e); err != nil {
		t.Fatal(err)
	}
	ccName := infra.ContractName(infra.KindEphemeralInfra, "job", "run")
	var winner string
	testenv.Eventually(t, 30*time.Second, "the guest ran and the contract completed", func() (bool, error) {
		var cc v1alpha1.ComputeContract
		err := env.Client.Get(ctx, key(ccName), &cc)
		if err == nil {
			winner = cc.Status.Winner
			if cc.Status.Phase == v1alpha1.ComputeContractFailed {
				t.Fatalf("contract failed: %s", cc.Status.Message)
			}
			return cc.Status.Phase == v1alpha1.ComputeContractReleased, fmt.Errorf("phase %s", cc.Status.Phase)
		}
		// Already deleted by the ending deployment: it must have been won first.
		return apierrors.IsNotFound(err) && winner != "", err
	})
	if winner != b.DID() {
		t.Fatalf("winner %s, want %s", winner, b.DID())
	}
	testenv.Eventually(t, 30*time.Second, "the EphemeralInfra deleted itself", func() (bool, error) {
		var got v1alpha1.EphemeralInfra
		err := env.Client.Get(ctx, key("job"), &got)
		return apierrors.IsNotFound(err), fmt.Errorf("%v: status %s", err, statusJSON(got.Status))
	})
	if err := env.Client.Get(ctx, key(ccName), &v1alpha1.ComputeContract{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ComputeContract %s left: %v", ccName, err)
	}
	waitNoProcs(t, b.stateDir)
	rec := pdsRecord(t, env, ephemeralInfraNSID, "job")
	if rec == nil || rec.Status == nil || deref(rec.Status.Phase) != "ended" || deref(rec.Status.EndReason) != "complete" {
		t.Fatalf("record %s, want phase ended, endReason complete", statusJSON(rec))
	}
	if c := recordContract(rec, "run"); c == nil || deref(c.Winner) != b.DID() {
		t.Fatalf("record contract %s, want the winner %s", statusJSON(c), b.DID())
	}
}
