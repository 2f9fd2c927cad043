package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	atinfra "socialweb.computer/internal/atproto/infra"
	"socialweb.computer/internal/testenv"
)

const infraNSID = "computer.socialweb.infra"

// newInfra creates an Infra bound to the repo "me" (publishing at its name) with the given
// description and staged contracts.
func newInfra(t *testing.T, env *testenv.Env, name, desc string, contracts []string, mut ...func(*v1alpha1.Infra)) *v1alpha1.Infra {
	t.Helper()
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.InfraSpec{Description: desc, Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}}}}
	for _, c := range contracts {
		inf.Spec.Contracts = append(inf.Spec.Contracts, v1alpha1.InfraContract{Name: c})
	}
	for _, m := range mut {
		m(inf)
	}
	if err := env.Client.Create(context.Background(), inf); err != nil {
		t.Fatal(err)
	}
	return inf
}

// waitInfra waits until cond holds for the Infra and returns it.
func waitInfra(t *testing.T, env *testenv.Env, name, what string, cond func(*v1alpha1.Infra) bool) *v1alpha1.Infra {
	t.Helper()
	var inf v1alpha1.Infra
	testenv.Eventually(t, 30*time.Second, "Infra "+name+": "+what, func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &inf); err != nil {
			return false, err
		}
		return cond(&inf), fmt.Errorf("spec %+v status %s", inf.Spec, statusJSON(inf.Status))
	})
	return &inf
}

func statusJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// inSync is an object whose record holds its declaration at its current generation.
func inSync(dir v1alpha1.RecordSyncDirection) func(*v1alpha1.Infra) bool {
	return func(inf *v1alpha1.Infra) bool {
		c := meta.FindStatusCondition(inf.Status.Conditions, string(v1alpha1.ConditionSynced))
		return c != nil && c.Status == metav1.ConditionTrue && inf.Status.Record != nil &&
			inf.Status.Record.Direction == dir && inf.Status.Record.SyncedGeneration == inf.Generation
	}
}

func condIs(inf *v1alpha1.Infra, t v1alpha1.ConditionType, status metav1.ConditionStatus, reason string) bool {
	c := meta.FindStatusCondition(inf.Status.Conditions, string(t))
	return c != nil && c.Status == status && (reason == "" || c.Reason == reason)
}

// pdsInfra reads the deployment record at rkey straight from the PDS; nil when absent.
func pdsInfra(t *testing.T, env *testenv.Env, rkey string) (*atinfra.Infra, string) {
	t.Helper()
	rec, err := env.PDS.Repo(env.Account.DID).Get(context.Background(), infraNSID, rkey)
	if err != nil {
		return nil, ""
	}
	var v atinfra.Infra
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		t.Fatalf("record %s: %v (%s)", rkey, err, rec.Value)
	}
	return &v, rec.CID
}

// putInfra writes a deployment record straight to the PDS, as a user editing the repo would.
func putInfra(t *testing.T, env *testenv.Env, rkey string, rec atinfra.Infra) string {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	_, res, err := env.PDS.Repo(env.Account.DID).Put(context.Background(), infraNSID, rkey, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res.CID
}

func staged(names ...string) []atinfra.InfraContract {
	var out []atinfra.InfraContract
	for _, n := range names {
		out = append(out, atinfra.InfraContract{Name: n, State: "staged"})
	}
	return out
}

func strp(s string) *string { return &s }

func contractNames(cs []v1alpha1.InfraContract) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

func recordContractNames(cs []atinfra.InfraContract) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// readIndex reads the index at self straight from the PDS.
func readIndex(t *testing.T, env *testenv.Env) *atinfra.InfraIndex {
	t.Helper()
	v, _ := pdsInfra(t, env, "self")
	if v == nil {
		return nil
	}
	return v.Index
}

func liveRkeys(idx *atinfra.InfraIndex) []string {
	var out []string
	if idx != nil {
		for _, e := range idx.Live {
			out = append(out, e.Rkey)
		}
	}
	return out
}

func condMessage(inf *v1alpha1.Infra, t v1alpha1.ConditionType) string {
	c := meta.FindStatusCondition(inf.Status.Conditions, string(t))
	if c == nil {
		return ""
	}
	return c.Message
}

func itoa(n int64) string { return fmt.Sprint(n) }

// editInfra changes the Infra's spec, retrying when the controller wrote in between.
func editInfra(t *testing.T, env *testenv.Env, name string, change func(*v1alpha1.Infra)) *v1alpha1.Infra {
	t.Helper()
	var inf v1alpha1.Infra
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(context.Background(), key(name), &inf); err != nil {
			return err
		}
		change(&inf)
		return env.Client.Update(context.Background(), &inf)
	})
	if err != nil {
		t.Fatalf("editing %s: %v", name, err)
	}
	return &inf
}

// infraRow is the Infra's row as kubectl get prints it, split into fields (NAME PHASE READY
// CONTRACTS... WINNER SYNCED AGE; "2 Staged" is two fields).
func infraRow(t *testing.T, env *testenv.Env, name string) []string {
	t.Helper()
	out := tkubectl(t, env.Core.KubeconfigPath, "", "get", "infra", name, "-n", ns, "--no-headers")
	return strings.Fields(out)
}
