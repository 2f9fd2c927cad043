package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/testenv"
)

// ACC29: a record that does not decode is neither pulled nor overwritten. Each of an unknown
// state, a contract name that is not a DNS label and two contracts of one name, written
// straight to the PDS over a bound Infra with a running contract, leaves the Infra with RecordValid False
// naming the reason, its spec and its ComputeContract as they were, and the record as written.
// A valid record afterwards is pulled again.
func TestACC29_UndecodableRecord(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	ctx := context.Background()
	localRepo(t, env, "me")
	b := startBidder(t, env, "bidder1.test", 5)
	newInfra(t, env, "web", "the api", nil, func(inf *v1alpha1.Infra) {
		inf.Spec.Contracts = []v1alpha1.InfraContract{denoContract("api", v1alpha1.ContractRequested, foreverGuest), {Name: "db"}}
	})
	ccName := infra.ContractName(infra.KindInfra, "web", "api")
	held := waitContract(t, env, ccName, v1alpha1.ComputeContractHeld)
	before := waitInfra(t, env, "web", "deployed and in sync", func(inf *v1alpha1.Infra) bool {
		return inf.Status.Phase == v1alpha1.InfraDeployed && inSync(v1alpha1.RecordInSync)(inf)
	})

	const head = `"createdAt":"2026-11-30T11:00:00Z","description":"changed elsewhere"`
	// A wrong $type or a contract without a name never reaches the repo: the PDS validates
	// every record of a lexicon it knows, as the reference PDS does (the decoder's BadType and
	// MissingName are for records read from a PDS that stored them anyway).
	for _, bad := range []string{
		`{"$type":"computer.socialweb.ephemeralInfra",` + head + `,"ttlSeconds":600}`,
		`{"$type":"computer.socialweb.infra",` + head + `,"contracts":[{"state":"staged"}]}`,
	} {
		var m map[string]any
		_ = json.Unmarshal([]byte(bad), &m)
		if _, _, err := env.PDS.Repo(env.Account.DID).Put(ctx, infraNSID, "web", m, nil); err == nil {
			t.Fatalf("putRecord of %s accepted, want it refused", bad)
		}
	}
	rows := []struct {
		name, reason, record string
	}{
		{"unknown state", string(infra.InvalidUnknownState), `{"$type":"computer.socialweb.infra",` + head + `,"contracts":[{"name":"api","state":"running"}]}`},
		{"contract name not a label", string(infra.InvalidBadName), `{"$type":"computer.socialweb.infra",` + head + `,"contracts":[{"name":"Api_1","state":"staged"}]}`},
		{"duplicate names", string(infra.InvalidDuplicateName), `{"$type":"computer.socialweb.infra",` + head + `,"contracts":[{"name":"api","state":"released"},{"name":"api","state":"staged"}]}`},
	}
	for _, row := range rows {
		var m map[string]any
		if err := json.Unmarshal([]byte(row.record), &m); err != nil {
			t.Fatal(err)
		}
		_, res, err := env.PDS.Repo(env.Account.DID).Put(ctx, infraNSID, "web", m, nil)
		if err != nil {
			t.Fatalf("%s: putRecord: %v", row.name, err)
		}
		inf := waitInfra(t, env, "web", row.name+": RecordValid False "+row.reason, func(inf *v1alpha1.Infra) bool {
			return condIs(inf, v1alpha1.ConditionRecordValid, "False", row.reason)
		})
		if c := meta.FindStatusCondition(inf.Status.Conditions, string(v1alpha1.ConditionSynced)); c == nil || c.Status != "False" {
			t.Fatalf("%s: Synced %+v, want False", row.name, c)
		}
		if inf.Spec.Description != "the api" || !slices.Equal(contractNames(inf.Spec.Contracts), []string{"api", "db"}) ||
			inf.Spec.Contracts[0].State != v1alpha1.ContractRequested || inf.Generation != before.Generation {
			t.Fatalf("%s: spec %+v (generation %d, was %d), want it untouched", row.name, inf.Spec, inf.Generation, before.Generation)
		}
		// Not overwritten: the record keeps what was written, reconciles later included.
		time.Sleep(500 * time.Millisecond)
		rec, err := env.PDS.Repo(env.Account.DID).Get(ctx, infraNSID, "web")
		if err != nil || rec.CID != res.CID {
			t.Fatalf("%s: record %v (%v), want cid %s kept", row.name, rec, err, res.CID)
		}
		cc := contractNow(t, env, ccName)
		if cc.Status.Phase != v1alpha1.ComputeContractHeld || cc.Spec.Release != nil || cc.UID != held.UID {
			t.Fatalf("%s: ComputeContract %s release %v, want it Held as declared", row.name, cc.Status.Phase, cc.Spec.Release)
		}
	}
	if n := running(t, b); n != 1 {
		t.Fatalf("%d guests, want the one still declared", n)
	}

	// A valid record is pulled again.
	putInfra(t, env, "web", mustRecord(t, `{"$type":"computer.socialweb.infra",`+head+`,"contracts":[{"name":"api","state":"released","computeKind":"deno"}]}`))
	waitInfra(t, env, "web", "pulled and valid", func(inf *v1alpha1.Infra) bool {
		return inSync(v1alpha1.RecordPulled)(inf) && condIs(inf, v1alpha1.ConditionRecordValid, "True", "") && inf.Spec.Description == "changed elsewhere"
	})
	waitNoProcs(t, b.stateDir)
}

func mustRecord(t *testing.T, s string) atinfra.Infra {
	t.Helper()
	var v atinfra.Infra
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}
