package config

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	rbacvalidation "k8s.io/kubernetes/pkg/registry/rbac/validation"
	rbacauthz "k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	atinfra "socialweb.computer/internal/atproto/infra"
	infractl "socialweb.computer/internal/controllers/infra"
	ctrlmanager "socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/nodeclaim"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/quota/ledger"
	"socialweb.computer/internal/repos"
	"socialweb.computer/internal/testenv"
)

// enforcement decides every request of the controllers as an API server enforcing RBAC
// would for their ServiceAccount: the request's attributes come from the API server's own
// RequestInfoFactory, the decision from the RBAC authorizer over the roles and bindings of
// the build plus the cluster's default policy (bootstrappolicy: discovery for every
// authenticated user). A denied request is answered 403 Forbidden and never sent.
type enforcement struct {
	role  *rbacv1.ClusterRole // the controllers'
	authz authorizer.Authorizer
	user  user.Info
	info  *apirequest.RequestInfoFactory

	mu     sync.Mutex
	denied map[string]int
	used   map[access]bool
	// refused are the accesses of the denied requests.
	refused map[access]bool
}

func newEnforcement(b *build) *enforcement {
	var roles []*rbacv1.Role
	var bindings []*rbacv1.RoleBinding
	var clusterRoles []*rbacv1.ClusterRole
	var clusterBindings []*rbacv1.ClusterRoleBinding
	for _, r := range b.roles {
		roles = append(roles, r)
	}
	for _, r := range b.clusterRoles {
		clusterRoles = append(clusterRoles, r)
	}
	bindings = append(bindings, b.rBindings...)
	clusterBindings = append(clusterBindings, b.crBindings...)
	for _, r := range bootstrappolicy.ClusterRoles() {
		clusterRoles = append(clusterRoles, r.DeepCopy())
	}
	for _, rb := range bootstrappolicy.ClusterRoleBindings() {
		clusterBindings = append(clusterBindings, rb.DeepCopy())
	}
	_, static := rbacvalidation.NewTestRuleResolver(roles, bindings, clusterRoles, clusterBindings)
	return &enforcement{
		role:  b.clusterRoles[controllerRole],
		authz: rbacauthz.New(static, static, static, static),
		user: &user.DefaultInfo{Name: "system:serviceaccount:" + namespace + ":" + serviceAccount,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, user.AllAuthenticated}},
		info:    &apirequest.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")},
		denied:  map[string]int{},
		used:    map[access]bool{},
		refused: map[access]bool{},
	}
}

type enforcer struct {
	next http.RoundTripper
	e    *enforcement
}

func (f enforcer) RoundTrip(req *http.Request) (*http.Response, error) {
	ri, err := f.e.info.NewRequestInfo(req)
	if err != nil {
		return nil, err
	}
	attrs := authorizer.AttributesRecord{User: f.e.user, Verb: ri.Verb, Namespace: ri.Namespace, APIGroup: ri.APIGroup,
		APIVersion: ri.APIVersion, Resource: ri.Resource, Subresource: ri.Subresource, Name: ri.Name,
		ResourceRequest: ri.IsResourceRequest, Path: ri.Path}
	decision, reason, err := f.e.authz.Authorize(req.Context(), attrs)
	what := fmt.Sprintf("%s %s", ri.Verb, ri.Path)
	var a access // of a resource request; zero for a path
	if ri.IsResourceRequest {
		res := ri.Resource
		if ri.Subresource != "" {
			res += "/" + ri.Subresource
		}
		a = access{group: ri.APIGroup, resource: res, verb: ri.Verb}
		what = fmt.Sprintf("%s %s/%s in %q", ri.Verb, ri.APIGroup, res, ri.Namespace)
		f.e.mu.Lock()
		f.e.used[a] = true
		f.e.mu.Unlock()
	}
	if decision == authorizer.DecisionAllow {
		return f.next.RoundTrip(req)
	}
	f.e.mu.Lock()
	f.e.denied[what]++
	if ri.IsResourceRequest {
		f.e.refused[a] = true
	}
	f.e.mu.Unlock()
	if err != nil {
		reason = fmt.Sprintf("%s: %v", reason, err)
	}
	// The body the API server's authorization filter writes.
	st := responsewriters.ForbiddenStatusError(attrs, reason).Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	body, _ := json.Marshal(st)
	return &http.Response{StatusCode: http.StatusForbidden, Status: "403 Forbidden", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": []string{"application/json"}}, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Request: req}, nil
}

// TestControllersUnderRBAC runs every controller `socialweb controllers` runs (NewControllers,
// with an embedded PDS so that repos resolve and the record paths run) against the embedded
// core, with each of their requests decided by RBAC as their ServiceAccount, and drives
// every kind through its create, sync and delete paths. Nothing may be denied. The Lease of
// leader election is not exercised: the core serves no coordination.k8s.io.
func TestControllersUnderRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the embedded core and every controller")
	}
	enf := newEnforcement(kustomize(t, "default"))
	runUnderRBAC(t, enf, nil)

	enf.mu.Lock()
	defer enf.mu.Unlock()
	var denied []string
	for what, n := range enf.denied {
		denied = append(denied, fmt.Sprintf("%s (%d times)", what, n))
	}
	sort.Strings(denied)
	if len(denied) > 0 {
		t.Errorf("RBAC denied the controllers:\n%s", strings.Join(denied, "\n"))
	}
}

// errRefused stops a run of runUnderRBAC once the access it watches for was refused.
var errRefused = errors.New("the watched access was refused")

// exitWithin is how long the controllers may take to end themselves after a refusal.
const exitWithin = 20 * time.Second

// runUnderRBAC starts every controller under enf and drives every kind through its create,
// sync and delete paths. With refused set, it stops driving as soon as enf refuses that
// access and returns what the controllers' Start returned within exitWithin after it (a
// manager still running then is stopped, and that is the error); otherwise it runs to the
// end (and fails the test on a step that does not happen).
func runUnderRBAC(t *testing.T, enf *enforcement, refused *access) (exit error) {
	env := testenv.Start(t, testenv.Options{PDS: true, Log: io.Discard})
	cfg := rest.CopyConfig(env.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return enforcer{next: rt, e: enf} })
	// start runs the controllers as one process; a restart stops them and starts anew.
	var cancel context.CancelFunc
	var done chan error
	start := func() {
		m, err := app.NewControllers(cfg, app.ControllerOptions{SkipNameValidation: true, PDS: env.PDS,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan error, 1)
		go func() { done <- m.Start(ctx) }()
	}
	// A watch an older version wrote: its status by merge patch, recorded under the legacy
	// manager, which the watch's first status apply moves to its own (a patch of the watch).
	legacyWatch(t, env)
	start()
	defer func() {
		r := recover()
		if r == errRefused { //nolint:errorlint // the sentinel itself
			select {
			case exit = <-done:
				return
			case <-time.After(exitWithin):
				exit = fmt.Errorf("the controllers still ran %s after the refusal", exitWithin)
			}
		}
		cancel()
		<-done
		if r != nil && r != errRefused { //nolint:errorlint // the sentinel itself
			panic(r)
		}
	}()

	d := &driver{t: t, c: env.Client, enf: enf, stopAt: refused}
	const ns = "default"
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

	// Repos: a local one, and a remote one logging in with a Secret.
	d.create(&v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "me"},
		Spec: v1alpha1.AtprotoRepoSpec{Local: &v1alpha1.LocalRepoSource{Account: env.Account.Handle}}})
	d.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"},
		Data: map[string][]byte{v1alpha1.DefaultCredentialsKey: []byte(env.Account.Password)}})
	d.create(&v1alpha1.AtprotoRepo{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "far"},
		Spec: v1alpha1.AtprotoRepoSpec{Remote: &v1alpha1.RemoteRepoSource{Service: env.PDS.URL(), Identifier: env.Account.Handle,
			CredentialsRef: v1alpha1.SecretKeyRef{Name: "creds"}}}})
	for _, name := range []string{"me", "far"} {
		d.wait("AtprotoRepo "+name+" logged in", &v1alpha1.AtprotoRepo{}, key(name), func(o client.Object) bool {
			c := meta.FindStatusCondition(o.(*v1alpha1.AtprotoRepo).Status.Conditions, string(v1alpha1.ConditionReady))
			return c != nil && c.Reason == string(v1alpha1.ReasonLoggedIn)
		})
	}

	// A published Infra: its record child, the repo's watch and its follower.
	d.create(&v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pub"},
		Spec: v1alpha1.InfraSpec{Description: "published", Record: &v1alpha1.InfraRecordBinding{RepoRef: v1alpha1.ObjectRef{Name: "me"}},
			Contracts: []v1alpha1.InfraContract{{Name: "api"}}}})
	d.wait("Infra pub in sync", &v1alpha1.Infra{}, key("pub"), func(o client.Object) bool {
		inf := o.(*v1alpha1.Infra)
		c := meta.FindStatusCondition(inf.Status.Conditions, string(v1alpha1.ConditionSynced))
		return c != nil && c.Status == metav1.ConditionTrue
	})
	d.wait("the repo's watch follows", &v1alpha1.AtprotoRecordWatch{}, key(infra.WatchName(infra.KindInfra, v1alpha1.ObjectRef{Name: "me"})), func(o client.Object) bool {
		c := meta.FindStatusCondition(o.(*v1alpha1.AtprotoRecordWatch).Status.Conditions, string(v1alpha1.ConditionReady))
		return c != nil && c.Status == metav1.ConditionTrue
	})

	// An Infra that requests a contract: its ComputeContract and the market controller.
	d.create(&v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req"},
		Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "web", State: v1alpha1.ContractRequested}}}})
	d.wait("the ComputeContract of req has its finalizer and a phase", &v1alpha1.ComputeContract{}, key("infra-req-web"), func(o client.Object) bool {
		cc := o.(*v1alpha1.ComputeContract)
		return len(cc.Finalizers) > 0 && cc.Status.Phase != ""
	})

	// A collection: a record put on the PDS by hand becomes a child that pulls it.
	putRecord(t, env, "handmade")
	d.create(&v1alpha1.InfraCollection{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine"},
		Spec: v1alpha1.InfraCollectionSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}}})
	d.wait("the collection's child pulled its record", &v1alpha1.Infra{}, key("handmade"), func(o client.Object) bool {
		return o.(*v1alpha1.Infra).Spec.Description == "typed by hand"
	})

	// An EphemeralInfra: its deadline in status; once its one contract is released it has
	// ended and deletes itself.
	d.create(&v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "eph"},
		Spec: v1alpha1.EphemeralInfraSpec{TTLSeconds: 600, InfraSpec: v1alpha1.InfraSpec{
			Contracts: []v1alpha1.InfraContract{{Name: "job", State: v1alpha1.ContractRequested}}}}})
	// Gone already counts: it ends only after its contract's phase is in its status.
	d.poll("the EphemeralInfra reports its deadline and its contract", func() (bool, error) {
		var e v1alpha1.EphemeralInfra
		if err := d.c.Get(context.Background(), key("eph"), &e); err != nil {
			return apierrors.IsNotFound(err), err
		}
		b, _ := json.Marshal(&e)
		return e.Status.ExpiresAt != nil && len(e.Status.Contracts) == 1 && e.Status.Contracts[0].Phase != "", errors.New(string(b))
	})
	// Its contract (a vm one, with no repo to write its rfp in) may have failed already, which
	// ends it as much as a release does: then it is gone or going by itself.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var eph v1alpha1.EphemeralInfra
		if err := env.Client.Get(context.Background(), key("eph"), &eph); err != nil {
			return client.IgnoreNotFound(err)
		}
		eph.Spec.Contracts[0].State = v1alpha1.ContractReleased
		// It may end and go between the read and this write.
		return client.IgnoreNotFound(env.Client.Update(context.Background(), &eph))
	}); err != nil {
		t.Fatal(err)
	}
	d.gone(&v1alpha1.EphemeralInfra{}, key("eph"))

	// An ephemeral collection: a live record put on the PDS by hand becomes a child.
	putEphemeralRecord(t, env, "ephhandmade")
	d.create(&v1alpha1.EphemeralInfraCollection{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "emine"},
		Spec: v1alpha1.InfraCollectionSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}}})
	d.wait("the ephemeral collection's child pulled its record", &v1alpha1.EphemeralInfra{}, key("ephhandmade"), func(o client.Object) bool {
		return o.(*v1alpha1.EphemeralInfra).Spec.Description == "typed by hand"
	})

	// A Cluster (no tenant control planes here) that publishes its nodes' Infra in its
	// owner's repo (which makes the owner's AtprotoRepo), and a NodeClaim of it.
	d.create(&v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"},
		Spec: v1alpha1.ClusterSpec{Account: env.Account.DID, Name: "c1", MaxNodes: 2, PublishInfra: true}})
	d.wait("the Cluster reports", &v1alpha1.Cluster{}, key("c1"), func(o client.Object) bool {
		c := o.(*v1alpha1.Cluster)
		return len(c.Finalizers) > 0 && meta.FindStatusCondition(c.Status.Conditions, string(v1alpha1.ConditionReady)) != nil
	})
	// Two claims of one owner: the node time of each goes into the owner's ledger Secret
	// when it is released (made by the first, updated by the second).
	for _, name := range []string{"n1", "n2"} {
		d.create(&v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.NodeClaimSpec{ClusterRef: v1alpha1.ObjectRef{Name: "c1"}, NodeName: name, OwnerDid: env.Account.DID}})
		d.wait("the NodeClaim "+name+" reports", &v1alpha1.NodeClaim{}, key(name), func(o client.Object) bool {
			n := o.(*v1alpha1.NodeClaim)
			return len(n.Finalizers) > 0 && n.Status.Phase != ""
		})
	}
	d.wait("the owner's repo for the Cluster's Infra", &v1alpha1.AtprotoRepo{},
		client.ObjectKey{Namespace: nodeclaim.DefaultContractNamespace, Name: infra.OwnerRepoName(env.Account.DID)},
		func(client.Object) bool { return true })

	// A restart (a new replica leading): the NodeClaim controller's resync reads the
	// Cluster and each claim of its Infra uncached.
	d.settle()
	cancel()
	<-done
	start()
	d.wait("the NodeClaim reports after the restart", &v1alpha1.NodeClaim{}, key("n1"), func(o client.Object) bool {
		return o.(*v1alpha1.NodeClaim).Status.Phase != ""
	})
	d.poll("the restarted controllers' resync ran", func() (bool, error) {
		enf.mu.Lock()
		defer enf.mu.Unlock()
		return enf.used[access{group: v1alpha1.GroupVersion.Group, resource: "nodeclaims", verb: "get"}], nil
	})

	// Deletion: every finalizer path runs and lets go. The collection goes first (the core
	// runs no garbage collector: its child is deleted by hand), so that the last object bound
	// through the repo deletes the repo's watch.
	for _, o := range []client.Object{
		&v1alpha1.InfraCollection{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mine"}},
		&v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "handmade"}},
		&v1alpha1.EphemeralInfraCollection{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "emine"}},
		&v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ephhandmade"}},
	} {
		if err := env.Client.Delete(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	d.gone(&v1alpha1.InfraCollection{}, key("mine"))
	d.gone(&v1alpha1.Infra{}, key("handmade"))
	d.gone(&v1alpha1.EphemeralInfraCollection{}, key("emine"))
	d.gone(&v1alpha1.EphemeralInfra{}, key("ephhandmade"))
	for _, name := range []string{"n1", "n2"} {
		if err := env.Client.Delete(context.Background(), &v1alpha1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
		d.gone(&v1alpha1.NodeClaim{}, key(name))
	}
	d.wait("the owner's node-time ledger holds both claims", &corev1.Secret{}, key(ledger.Name(env.Account.DID)), func(o client.Object) bool {
		return len(o.(*corev1.Secret).Data) == 2
	})
	for _, o := range []client.Object{
		&v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1"}},
		&v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pub"}},
		&v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "req"}},
	} {
		if err := env.Client.Delete(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	d.gone(&v1alpha1.Cluster{}, key("c1"))
	d.gone(&v1alpha1.Infra{}, key("pub"))
	d.gone(&v1alpha1.AtprotoRecord{}, key(infra.RecordChildName(infra.KindInfra, "pub")))
	d.gone(&v1alpha1.AtprotoRecordWatch{}, key(infra.WatchName(infra.KindInfra, v1alpha1.ObjectRef{Name: "me"})))
	d.gone(&v1alpha1.Infra{}, key("req"))
	d.gone(&v1alpha1.ComputeContract{}, key("infra-req-web"))
	return nil
}

// legacyWatch makes the AtprotoRecordWatch the Infra "pub" of runUnderRBAC will use, with
// a Ready condition written as versions before server-side apply wrote it: a merge patch of
// the status with no field manager, so the API server records it under the client's user
// agent (reconcilekit's legacy status managers).
func legacyWatch(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	w := &v1alpha1.AtprotoRecordWatch{ObjectMeta: metav1.ObjectMeta{Namespace: "default",
		Name: infra.WatchName(infra.KindInfra, v1alpha1.ObjectRef{Name: "me"}), Labels: map[string]string{v1alpha1.LabelInfraKind: string(infra.KindInfra)}},
		Spec: v1alpha1.AtprotoRecordWatchSpec{RepoRef: v1alpha1.ObjectRef{Name: "me"}, Collection: infra.KindInfra.Collection()}}
	if err := env.Client.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	before := w.DeepCopy()
	meta.SetStatusCondition(&w.Status.Conditions, metav1.Condition{Type: string(v1alpha1.ConditionReady), Status: metav1.ConditionFalse,
		Reason: "Pending", Message: "written by an older version"})
	if err := env.Client.Status().Patch(ctx, w, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	var legacy bool
	for _, e := range w.ManagedFields {
		legacy = legacy || (e.Subresource == "status" && e.Operation == metav1.ManagedFieldsOperationUpdate)
	}
	if !legacy {
		t.Fatalf("the watch's status is not recorded as an update: %+v", w.ManagedFields)
	}
}

// driver creates objects and waits on them as their owner (the admin client).
type driver struct {
	t   *testing.T
	c   client.Client
	enf *enforcement
	// stopAt, when set, ends the run (panicking errRefused) once enf refused it.
	stopAt *access
}

func (d *driver) create(o client.Object) {
	d.t.Helper()
	if err := d.c.Create(context.Background(), o); err != nil {
		d.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// wait polls until cond holds for the object, failing early with the denials so far.
func (d *driver) wait(what string, o client.Object, k client.ObjectKey, cond func(client.Object) bool) {
	d.t.Helper()
	d.poll(what, func() (bool, error) {
		if err := d.c.Get(context.Background(), k, o); err != nil {
			return false, err
		}
		b, _ := json.Marshal(o)
		return cond(o), errors.New(string(b))
	})
}

func (d *driver) gone(o client.Object, k client.ObjectKey) {
	d.t.Helper()
	d.poll(fmt.Sprintf("%T %s gone", o, k.Name), func() (bool, error) {
		err := d.c.Get(context.Background(), k, o)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		b, _ := json.Marshal(o)
		return false, fmt.Errorf("%v %s", err, b)
	})
}

// settle lets requests in flight land, then stops the run if the watched access was
// refused by now: before a restart, which would otherwise take the refusal's exit for its
// own stop.
func (d *driver) settle() {
	time.Sleep(200 * time.Millisecond)
	d.poll("settle", func() (bool, error) { return true, nil })
}

func (d *driver) poll(what string, cond func() (bool, error)) {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		if d.stopAt != nil {
			d.enf.mu.Lock()
			refused := d.enf.refused[*d.stopAt]
			d.enf.mu.Unlock()
			if refused {
				panic(errRefused)
			}
		}
		ok, err := cond()
		if ok {
			return
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	d.enf.mu.Lock()
	defer d.enf.mu.Unlock()
	d.t.Fatalf("%s: not within 30s; denied so far: %v; last: %v", what, d.enf.denied, last)
}

// putEphemeralRecord writes a live ephemeralInfra record at rkey and its index entry, as a
// writer other than the controllers (a CLI) would.
func putEphemeralRecord(t *testing.T, env *testenv.Env, rkey string) {
	t.Helper()
	desc := "typed by hand"
	now := time.Now()
	putRecordOf(t, env, infra.KindEphemeralInfra, rkey, atinfra.EphemeralInfra{CreatedAt: now.UTC().Format(time.RFC3339), Description: &desc, TTLSeconds: 3600}, now.Add(time.Hour))
}

// putRecord writes a deployment record at rkey and its entry in the index at self, as a
// writer other than the controllers (a CLI) would.
func putRecord(t *testing.T, env *testenv.Env, rkey string) {
	t.Helper()
	desc := "typed by hand"
	putRecordOf(t, env, infra.KindInfra, rkey, atinfra.Infra{CreatedAt: "2026-11-30T11:00:00Z", Description: &desc}, time.Time{})
}

// putRecordOf writes rec, a record of kind, at rkey and its entry in the index at self;
// expires is the record's deadline (zero: none).
func putRecordOf(t *testing.T, env *testenv.Env, kind infra.Kind, rkey string, rec any, expires time.Time) {
	t.Helper()
	ctx := context.Background()
	repo, err := repos.Local(ctx, env.PDS, env.Account.DID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if _, _, err := env.PDS.Repo(env.Account.DID).Put(ctx, kind.Collection(), rkey, m, nil); err != nil {
		t.Fatal(err)
	}
	var exp *time.Time
	if !expires.IsZero() {
		exp = &expires
	}
	for {
		idx, selfCreatedAt, swap, err := infractl.ReadIndex(ctx, repo)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		next, changed := infra.IndexPass(idx, infra.IndexEntryFor(kind, rkey, now, exp, "cli"), true, now)
		if !changed {
			return
		}
		if selfCreatedAt == "" {
			selfCreatedAt = now.UTC().Format(time.RFC3339)
		}
		b, _ := json.Marshal(atinfra.Infra{CreatedAt: selfCreatedAt, Index: next})
		if _, err := repo.Put(ctx, atinfra.InfraNSID, infra.RkeySelf, b, &swap); err == nil {
			return
		} else if !errors.Is(err, repos.ErrSwapMismatch) {
			t.Fatal(err)
		}
	}
}

// TestRBACDecisions asks the RBAC authorizer, over the build and the default bootstrap
// policy, about the requests no in-process run makes (the core serves no Leases, Events,
// TokenReviews or SubjectAccessReviews): leader election in the controllers' namespace and
// nowhere else, the metrics filter's reviews, a scraper's GET /metrics; and about requests
// the controllers must not be able to make.
func TestRBACDecisions(t *testing.T) {
	b := kustomize(t, "default")
	enf := newEnforcement(b)
	scraper := &user.DefaultInfo{Name: "system:serviceaccount:monitoring:prometheus",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:monitoring", user.AllAuthenticated}}
	// The scraper holds the reader role through a binding of its own, as a site would add.
	b.crBindings = append(b.crBindings, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scrape"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "socialweb-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"}}})
	withScraper := newEnforcement(b)

	ctrl := enf.user
	for _, c := range []struct {
		name  string
		e     *enforcement
		who   user.Info
		attrs authorizer.AttributesRecord
		allow bool
	}{
		{"lease get", enf, ctrl, res("get", "coordination.k8s.io", "leases", "", namespace), true},
		{"lease create", enf, ctrl, res("create", "coordination.k8s.io", "leases", "", namespace), true},
		{"lease update (renew, release)", enf, ctrl, res("update", "coordination.k8s.io", "leases", "", namespace), true},
		{"lease delete", enf, ctrl, res("delete", "coordination.k8s.io", "leases", "", namespace), false},
		{"lease in another namespace", enf, ctrl, res("update", "coordination.k8s.io", "leases", "", "kube-system"), false},
		{"no Events: the Lease lock records none", enf, ctrl, res("create", "", "events", "", namespace), false},
		{"no Events elsewhere", enf, ctrl, res("create", "", "events", "", "default"), false},
		{"metrics filter: tokenreview", enf, ctrl, res("create", "authentication.k8s.io", "tokenreviews", "", ""), true},
		{"metrics filter: subjectaccessreview", enf, ctrl, res("create", "authorization.k8s.io", "subjectaccessreviews", "", ""), true},
		{"core Secrets: credentials and join bundles", enf, ctrl, res("get", "", "secrets", "", "default"), true},
		{"core Secrets: no patch", enf, ctrl, res("patch", "", "secrets", "", "default"), false},
		{"no ConfigMaps", enf, ctrl, res("get", "", "configmaps", "", "default"), false},
		{"no Pods", enf, ctrl, res("list", "", "pods", "", ""), false},
		{"Clusters by patch, not update", enf, ctrl, res("update", "socialweb.computer", "clusters", "", "default"), false},
		{"no deletecollection", enf, ctrl, res("deletecollection", "socialweb.computer", "infras", "", "default"), false},
		{"no finalizers subresource", enf, ctrl, res("update", "socialweb.computer", "infras", "finalizers", "default"), false},
		{"our own /metrics: no", enf, ctrl, nonRes("get", "/metrics"), false},
		{"scraper GET /metrics", withScraper, scraper, nonRes("get", "/metrics"), true},
		{"scraper without the binding", enf, scraper, nonRes("get", "/metrics"), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.attrs.User = c.who
			d, reason, err := c.e.authz.Authorize(context.Background(), c.attrs)
			if got := d == authorizer.DecisionAllow; got != c.allow {
				t.Errorf("%s %s/%s%s in %q: allowed %v, want %v (%s %v)", c.attrs.Verb, c.attrs.APIGroup, c.attrs.Resource, c.attrs.Path, c.attrs.Namespace, got, c.allow, reason, err)
			}
		})
	}
}

func res(verb, group, resource, sub, ns string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{Verb: verb, APIGroup: group, Resource: resource, Subresource: sub, Namespace: ns, ResourceRequest: true}
}

func nonRes(verb, path string) authorizer.AttributesRecord {
	return authorizer.AttributesRecord{Verb: verb, Path: path}
}

// notExercised are the accesses the controllers' role grants that runUnderRBAC does not
// make, each with why it is granted all the same. Empty: the run makes every one.
var notExercised = map[access]string{}

// TestEveryRuleIsNeeded removes each access the controllers' ClusterRole grants (a verb on a
// resource of a rule), one at a time, and runs the controllers under the rest: the run must
// be refused exactly that access, answered with a Forbidden that names the verb and the
// resource, as an API server would. An access the run does not make must be in notExercised
// with its reason. The leader-election Role and the metrics roles are decided one request at
// a time in TestRBACDecisions.
func TestEveryRuleIsNeeded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the embedded core and every controller, once per rule")
	}
	b := kustomize(t, "default")
	full := newEnforcement(b)
	runUnderRBAC(t, full, nil)
	// The caches read through watch-list streams where the server serves them (verb watch);
	// a second run with client-go's WatchListClient off makes the plain lists of a server
	// that does not.
	lists := newEnforcement(b)
	t.Run("lists", func(t *testing.T) {
		clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
		runUnderRBAC(t, lists, nil)
	})
	for a := range lists.used {
		if a.verb == "list" {
			full.used[a] = true
		}
	}
	granted := rules("", controllerRole, full.role.Rules)
	var all []access
	for a := range granted {
		all = append(all, access{group: a.group, resource: a.resource, verb: a.verb})
	}
	// The lists last: a manager refused its cache's list does not stop its informers (the
	// process would end; a test goes on), and their retries would slow the runs after them.
	sort.Slice(all, func(i, j int) bool {
		if li, lj := all[i].verb == "list", all[j].verb == "list"; li != lj {
			return lj
		}
		return all[i].String() < all[j].String()
	})
	for _, a := range all {
		if reason, ok := notExercised[a]; ok {
			if full.used[a] {
				t.Errorf("%s is listed as not exercised (%s), but the run made it", a, reason)
			}
			continue
		}
		if !full.used[a] {
			t.Errorf("%s is granted, the run does not make it, and notExercised gives no reason", a)
			continue
		}
		t.Run(a.verb+" "+a.group+"/"+a.resource, func(t *testing.T) {
			if a.verb == "list" {
				clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
			}
			enf := newEnforcement(withoutAccess(b, a))
			exit := runUnderRBAC(t, enf, &a)
			enf.mu.Lock()
			defer enf.mu.Unlock()
			if !enf.refused[a] {
				t.Fatalf("without %s the run was refused %v, not it", a, enf.denied)
			}
			// The process ends on it, once, naming what to grant.
			f, ok := ctrlmanager.AsForbidden(exit)
			if !ok {
				t.Fatalf("without %s the controllers did not end on a Forbidden: %v", a, exit)
			}
			if f.Verb != a.verb || f.Resource != a.resource || f.Group != a.group {
				t.Errorf("without %s the controllers ended on %v", a, f)
			}
		})
	}
}

// withoutAccess is b with the controllers' ClusterRole granting everything it did but a.
func withoutAccess(b *build, a access) *build {
	role := b.clusterRoles[controllerRole].DeepCopy()
	role.Rules = nil
	for g := range rules("", controllerRole, b.clusterRoles[controllerRole].Rules) {
		if g.group == a.group && g.resource == a.resource && g.verb == a.verb {
			continue
		}
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{g.group}, Resources: []string{g.resource}, Verbs: []string{g.verb}})
	}
	out := *b
	out.clusterRoles = map[string]*rbacv1.ClusterRole{}
	for k, v := range b.clusterRoles {
		out.clusterRoles[k] = v
	}
	out.clusterRoles[controllerRole] = role
	return &out
}
