package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/testenv"
	"socialweb.computer/internal/watch"
)

const ns = "default"

// noteCollection has no lexicon here: the PDS stores it as "unknown" and the controller
// checks only that it is an object with the right $type.
const noteCollection = "com.example.note"

func key(name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

// localRepo creates an AtprotoRepo for the harness's default account and waits until Ready.
func localRepo(t *testing.T, env *testenv.Env, name string) *v1alpha1.AtprotoRepo {
	t.Helper()
	r := &v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: env.Account.Handle}}}
	if err := env.Client.Create(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return waitRepoReason(t, env, name, v1alpha1.ReasonLoggedIn)
}

func waitRepoReason(t *testing.T, env *testenv.Env, name string, reason v1alpha1.ConditionReason) *v1alpha1.AtprotoRepo {
	t.Helper()
	var r v1alpha1.AtprotoRepo
	testenv.Eventually(t, 20*time.Second, "AtprotoRepo "+name+" "+string(reason), func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &r); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(r.Status.Conditions, string(v1alpha1.ConditionReady))
		if c == nil {
			return false, nil
		}
		return c.Reason == string(reason), fmt.Errorf("Ready is %s/%s: %s", c.Status, c.Reason, c.Message)
	})
	return &r
}

func raw(v any) runtime.RawExtension {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return runtime.RawExtension{Raw: b}
}

func note(text string) map[string]any {
	return map[string]any{"$type": noteCollection, "text": text}
}

func newRecord(t *testing.T, env *testenv.Env, name, repo, collection, rkey string, value any, mut ...func(*v1alpha1.AtprotoRecord)) *v1alpha1.AtprotoRecord {
	t.Helper()
	r := &v1alpha1.AtprotoRecord{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.AtprotoRecordSpec{RepoRef: v1alpha1.ObjectRef{Name: repo}, Collection: collection, RKey: rkey, Record: raw(value)}}
	for _, m := range mut {
		m(r)
	}
	if err := env.Client.Create(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	return r
}

// waitRecord waits until the record's InSync condition has the reason (for the object's
// current generation) and returns the object.
func waitRecord(t *testing.T, env *testenv.Env, name string, reason v1alpha1.ConditionReason) *v1alpha1.AtprotoRecord {
	t.Helper()
	var r v1alpha1.AtprotoRecord
	testenv.Eventually(t, 20*time.Second, "AtprotoRecord "+name+" "+string(reason), func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &r); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(r.Status.Conditions, string(v1alpha1.ConditionInSync))
		if c == nil {
			return false, nil
		}
		return c.Reason == string(reason) && c.ObservedGeneration == r.Generation, fmt.Errorf("InSync is %s/%s: %s", c.Status, c.Reason, c.Message)
	})
	return &r
}

// userClient is a user of the PDS acting over XRPC, outside the controllers.
func userClient(t *testing.T, env *testenv.Env) *atclient.Client {
	t.Helper()
	c := atclient.New(env.PDS.URL())
	if _, err := c.Login(context.Background(), env.Account.Handle, env.Account.Password); err != nil {
		t.Fatal(err)
	}
	return c
}

func newWatch(t *testing.T, env *testenv.Env, name, repo, collection string) {
	t.Helper()
	w := &v1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.AtprotoRecordWatchSpec{RepoRef: v1alpha1.ObjectRef{Name: repo}, Collection: collection}}
	if err := env.Client.Create(context.Background(), w); err != nil {
		t.Fatal(err)
	}
}

// waitWatch waits until cond holds for the watch's status.
func waitWatch(t *testing.T, env *testenv.Env, name, what string, cond func(st v1alpha1.AtprotoRecordWatchStatus) bool) v1alpha1.AtprotoRecordWatchStatus {
	t.Helper()
	var w v1alpha1.AtprotoRecordWatch
	testenv.Eventually(t, 20*time.Second, "watch "+name+": "+what, func() (bool, error) {
		if err := env.Client.Get(context.Background(), key(name), &w); err != nil {
			return false, err
		}
		return cond(w.Status), fmt.Errorf("status %+v", w.Status)
	})
	return w.Status
}

func hasRecord(st v1alpha1.AtprotoRecordWatchStatus, uri, cid string) bool {
	for _, r := range st.Records {
		if r.URI == uri && (cid == "" || r.CID == cid) {
			return true
		}
	}
	return false
}

func wasDeleted(st v1alpha1.AtprotoRecordWatchStatus, uri string) bool {
	for _, r := range st.Deleted {
		if r.URI == uri {
			return true
		}
	}
	return false
}

type watchChange = watch.Change
