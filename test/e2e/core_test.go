package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/config/crd"
	"socialweb.computer/internal/core"
	"socialweb.computer/internal/testenv"
)

func TestCore_ServesEveryKindOverAuthenticatedTLS(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := dc.ServerResourcesForGroupVersion(v1alpha1.GroupVersion.String())
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	got := map[string]bool{}
	for _, r := range rl.APIResources {
		if !strings.Contains(r.Name, "/") {
			got[r.Kind] = r.Namespaced
		}
	}
	for _, kind := range []string{"Infra", "EphemeralInfra", "InfraCollection", "EphemeralInfraCollection", "ComputeContract",
		"AtprotoRepo", "AtprotoRecord", "AtprotoRecordWatch", "Cluster", "NodeClaim"} {
		namespaced, ok := got[kind]
		if !ok {
			t.Errorf("kind %s is not served", kind)
		} else if !namespaced {
			t.Errorf("kind %s is cluster-scoped; every kind is namespaced", kind)
		}
	}
	// No kind of ours is named like a core kind; credentials are core/v1 Secrets, the only
	// resource of /api/v1.
	if _, ok := got["Secret"]; ok {
		t.Errorf("kind Secret is served in %s; a kind of ours named like a core kind", v1alpha1.GroupVersion)
	}
	core, err := dc.ServerResourcesForGroupVersion("v1")
	if err != nil {
		t.Fatalf("discovery of v1: %v", err)
	}
	var coreNames []string
	for _, r := range core.APIResources {
		coreNames = append(coreNames, r.Name)
		if r.Name == "secrets" && (r.Kind != "Secret" || !r.Namespaced) {
			t.Errorf("v1 secrets: kind %s namespaced %v", r.Kind, r.Namespaced)
		}
	}
	if strings.Join(coreNames, ",") != "secrets" {
		t.Errorf("v1 serves %v, want only secrets", coreNames)
	}
	groups, err := dc.ServerGroups()
	if err != nil {
		t.Fatalf("/apis: %v", err)
	}
	found := false
	for _, g := range groups.Groups {
		found = found || g.Name == v1alpha1.GroupVersion.Group
	}
	if !found {
		t.Errorf("/apis does not list %s", v1alpha1.GroupVersion.Group)
	}

	// Anonymous and wrong-token requests are refused with 401.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for name, token := range map[string]string{"anonymous": "", "wrong token": "not-the-token"} {
		req, _ := http.NewRequest(http.MethodGet, env.Core.URL+"/apis/socialweb.computer/v1alpha1/infras", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := insecure.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s request: status %d, want 401", name, resp.StatusCode)
		}
	}
}

func TestCore_RestartKeepsEveryObject(t *testing.T) {
	dir := t.TempDir()
	env := testenv.Start(t, testenv.Options{DataDir: dir})
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c"} {
		inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1alpha1.InfraSpec{Description: "kept " + name}}
		if err := env.Client.Create(ctx, inf); err != nil {
			t.Fatal(err)
		}
	}
	env.Stop()

	env = testenv.Start(t, testenv.Options{DataDir: dir})
	var list v1alpha1.InfraList
	if err := env.Client.List(ctx, &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 3 {
		t.Fatalf("after restart: %d Infras, want 3", len(list.Items))
	}
	for _, it := range list.Items {
		if it.Spec.Description != "kept "+it.Name {
			t.Errorf("%s: description %q", it.Name, it.Spec.Description)
		}
	}
}

// Every start installs the CRDs again: one that is already as declared is left alone (no
// update request at all), one that differs is updated.
func TestCore_InstallUpdatesOnlyChangedCRDs(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	var updates atomic.Int32
	counting := rest.CopyConfig(env.Config)
	counting.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/customresourcedefinitions/") {
				updates.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})

	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := core.InstallCRDs(ctx, counting, crds); err != nil {
		t.Fatal(err)
	}
	if n := updates.Swap(0); n != 0 {
		t.Errorf("installing the CRDs a second time sent %d updates, want 0", n)
	}

	changed := crds[0].DeepCopy()
	changed.Spec.Versions[0].AdditionalPrinterColumns = append(changed.Spec.Versions[0].AdditionalPrinterColumns,
		apiextensionsv1.CustomResourceColumnDefinition{Name: "Made", Type: "date", JSONPath: ".metadata.creationTimestamp"})
	if err := core.InstallCRDs(ctx, counting, append([]*apiextensionsv1.CustomResourceDefinition{changed}, crds[1:]...)); err != nil {
		t.Fatal(err)
	}
	if n := updates.Load(); n != 1 {
		t.Errorf("installing one changed CRD sent %d updates, want 1", n)
	}
	cs, err := apiextensionsclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, changed.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cols := got.Spec.Versions[0].AdditionalPrinterColumns
	if len(cols) == 0 || cols[len(cols)-1].Name != "Made" {
		t.Errorf("%s was not updated: printer columns %v", changed.Name, cols)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCore_DataDirIsLockedWhileInUse(t *testing.T) {
	dir := t.TempDir()
	d, err := core.OpenDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	_, err = core.OpenDataDir(dir)
	if !errors.Is(err, core.ErrDataDirLocked) {
		t.Fatalf("second open: %v, want ErrDataDirLocked", err)
	}
	if !strings.Contains(err.Error(), "pid ") {
		t.Errorf("lock error does not name the holder: %v", err)
	}
}

func TestCore_RefusesForeignAndCorruptDataDirs(t *testing.T) {
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	var dde *core.DataDirError
	if _, err := core.OpenDataDir(foreign); !errors.As(err, &dde) {
		t.Fatalf("foreign dir: %v, want a DataDirError", err)
	}
	if b, _ := os.ReadFile(filepath.Join(foreign, "notes.txt")); string(b) != "mine" {
		t.Error("foreign dir was changed")
	}
	if entries, _ := os.ReadDir(foreign); len(entries) != 1 {
		t.Errorf("foreign dir gained files: %v", entries)
	}

	corrupt := t.TempDir()
	if err := os.WriteFile(filepath.Join(corrupt, "socialweb.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := core.OpenDataDir(corrupt); !errors.As(err, &dde) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt marker: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(corrupt, "socialweb.json")); string(b) != "{not json" {
		t.Error("corrupt marker was overwritten")
	}
}

// A data dir may hold what an operator stages before the first start (the vm image, the node
// bidder's image tarballs); anything else still marks it as someone else's.
func TestCore_DataDirStagedBeforeFirstStart(t *testing.T) {
	staged := t.TempDir()
	for _, p := range []string{"images/vm/image.json", "node-bidder/images/probe.tar"} {
		if err := os.MkdirAll(filepath.Join(staged, filepath.Dir(p)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(staged, p), []byte("staged"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := core.OpenDataDir(staged)
	if err != nil {
		t.Fatalf("a dir holding only staged images: %v", err)
	}
	d.Close()
	if b, _ := os.ReadFile(filepath.Join(staged, "node-bidder/images/probe.tar")); string(b) != "staged" {
		t.Error("the staged tarball was changed")
	}
	if _, err := os.Stat(filepath.Join(staged, "socialweb.json")); err != nil {
		t.Errorf("no marker written: %v", err)
	}

	mixed := t.TempDir()
	os.MkdirAll(filepath.Join(mixed, "images"), 0o700)
	os.WriteFile(filepath.Join(mixed, "notes.txt"), []byte("mine"), 0o600)
	var dde *core.DataDirError
	if _, err := core.OpenDataDir(mixed); !errors.As(err, &dde) || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("staged images beside a foreign file: %v, want a DataDirError naming it", err)
	}
}

func TestCore_PortInUseIsOneClearError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir, err := core.OpenDataDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, err = core.Start(context.Background(), core.Config{Dir: dir, Listen: ln.Addr().String()})
	var pe *core.PortInUseError
	if !errors.As(err, &pe) {
		t.Fatalf("start on a used port: %v, want PortInUseError", err)
	}
	// The failed start released the data dir.
	d2, err := core.OpenDataDir(dir.Root)
	if err != nil {
		t.Fatalf("data dir still locked after a failed start: %v", err)
	}
	d2.Close()
}

// A core/v1 Secret written with stringData reads back as data, and is stored encrypted.
func TestSecret_DataIsEncryptedAtRest(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	const plaintext = "correct-horse-battery-staple"
	// Written as a user writes one for any cluster: core/v1, stringData.
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app-password", Namespace: "default"},
		StringData: map[string]string{"password": plaintext}}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	var back corev1.Secret
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(s), &back); err != nil {
		t.Fatal(err)
	}
	if string(back.Data["password"]) != plaintext {
		t.Fatalf("read back %q", back.Data["password"])
	}

	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + env.Core.DataDir().EtcdSocket()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	resp, err := etcd.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var stored []byte
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "secrets") && strings.HasSuffix(string(kv.Key), "/default/app-password") {
			stored = kv.Value
		}
	}
	if stored == nil {
		t.Fatal("the Secret is not in etcd under /registry/")
	}
	if !strings.HasPrefix(string(stored), "k8s:enc:secretbox:v1:") {
		t.Errorf("stored Secret is not secretbox-encrypted: %.40q", stored)
	}
	if strings.Contains(string(stored), plaintext) {
		t.Error("the plaintext is in etcd")
	}
	// And an Infra (not a Secret) is stored in the clear: the guard can tell the two apart.
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"}, Spec: v1alpha1.InfraSpec{Description: plaintext}}
	if err := env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	resp, err = etcd.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	clear := false
	for _, kv := range resp.Kvs {
		clear = clear || (strings.HasSuffix(string(kv.Key), "/default/plain") && strings.Contains(string(kv.Value), plaintext))
	}
	if !clear {
		t.Error("an Infra is not readable in etcd; the encryption check above proves nothing")
	}
}

func TestInfra_InvalidObjectsAreRefusedWithFieldMessages(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	ctx := context.Background()
	contract := func(name string, state v1alpha1.ContractState) v1alpha1.InfraContract {
		return v1alpha1.InfraContract{Name: name, State: state}
	}
	rows := []struct {
		name string
		obj  client.Object
		want []string
	}{
		{"uppercase contract name",
			&v1alpha1.Infra{Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{contract("Web", "")}}},
			[]string{"spec.contracts[0].name"}},
		{"duplicate contract name",
			&v1alpha1.Infra{Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{contract("web", ""), contract("web", "")}}},
			[]string{"spec.contracts", "unique"}},
		{"unknown state",
			&v1alpha1.Infra{Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{contract("web", "Running")}}},
			[]string{"spec.contracts[0].state", "Unsupported value"}},
		{"ttlSeconds 10",
			&v1alpha1.EphemeralInfra{Spec: v1alpha1.EphemeralInfraSpec{TTLSeconds: 10}},
			[]string{"spec.ttlSeconds", "greater than or equal to 60"}},
		{"unknown endWhen",
			&v1alpha1.EphemeralInfra{Spec: v1alpha1.EphemeralInfraSpec{TTLSeconds: 600, EndWhen: "Never"}},
			[]string{"spec.endWhen", "Unsupported value"}},
	}
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			row.obj.SetNamespace("default")
			row.obj.SetName("bad-" + string(rune('a'+i)))
			err := env.Client.Create(ctx, row.obj)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v, want Invalid", err)
			}
			for _, w := range row.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	// The same objects with the mistakes fixed are accepted: the refusals were for the field.
	ok := &v1alpha1.EphemeralInfra{ObjectMeta: metav1.ObjectMeta{Name: "good", Namespace: "default"},
		Spec: v1alpha1.EphemeralInfraSpec{InfraSpec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{contract("web", ""), contract("db", v1alpha1.ContractRequested)}}}}
	if err := env.Client.Create(ctx, ok); err != nil {
		t.Fatalf("valid EphemeralInfra refused: %v", err)
	}
	if ok.Spec.TTLSeconds != 3600 || ok.Spec.EndWhen != v1alpha1.EndWhenComplete || ok.Spec.Contracts[0].State != v1alpha1.ContractStaged {
		t.Errorf("defaults not applied: ttl %d endWhen %q state %q", ok.Spec.TTLSeconds, ok.Spec.EndWhen, ok.Spec.Contracts[0].State)
	}
}

func TestInfra_ControllerReportsStatusOfANewObject(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true})
	ctx := context.Background()
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: v1alpha1.InfraSpec{Contracts: []v1alpha1.InfraContract{{Name: "api"}}}}
	if err := env.Client.Create(ctx, inf); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "Infra status reported", func() (bool, error) {
		var got v1alpha1.Infra
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(inf), &got); err != nil {
			return false, err
		}
		return got.Status.ObservedGeneration == got.Generation && got.Status.Phase == v1alpha1.InfraStaged && got.Status.ContractsReady == "0/0", nil
	})
}

// A fresh core has no CRD it established less than core.JustEstablishedWindow ago: the API
// server holds back every create of such a CRD's objects for that long (a wait for HA peers
// the embedded core does not have), so the first create of each kind would wait two seconds.
func TestCore_FreshStartHoldsNoCreateBack(t *testing.T) {
	env := testenv.Start(t, testenv.Options{})
	cs, err := apiextensionsclient.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	crds, err := cs.ApiextensionsV1().CustomResourceDefinitions().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(crds.Items) == 0 {
		t.Fatal("no CRDs")
	}
	now := time.Now()
	for _, crd := range crds.Items {
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && now.Sub(c.LastTransitionTime.Time) < core.JustEstablishedWindow {
				t.Errorf("CRD %s established %s ago: its first create would wait", crd.Name, now.Sub(c.LastTransitionTime.Time).Round(time.Millisecond))
			}
		}
	}
}

// A data dir from before credentials were core/v1 Secrets: its secrets.socialweb.computer
// objects are moved at start to core Secrets of the same name (data, type and labels kept,
// encrypted at rest with the data dir's key), and the old CRD goes.
func TestCore_LegacySecretsMoveToCoreSecrets(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	legacy := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: core.LegacySecretsCRD},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "socialweb.computer", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "secrets", Singular: "secret", Kind: "Secret", ListKind: "SecretList"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"type": {Type: "string"},
						"data": {Type: "object", AdditionalProperties: &apiextensionsv1.JSONSchemaPropsOrBool{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string", Format: "byte"}}},
					}}}}},
		},
	}
	start := func(crds []*apiextensionsv1.CustomResourceDefinition) *core.Core {
		t.Helper()
		dir, err := core.OpenDataDir(root)
		if err != nil {
			t.Fatal(err)
		}
		c, err := core.Start(ctx, core.Config{Dir: dir, CRDs: crds})
		if err != nil {
			dir.Close()
			t.Fatal(err)
		}
		return c
	}
	// The old data dir: its CRD was installed by an earlier version (an install through
	// Start would be moved at once).
	c := start(crds)
	if err := core.InstallCRDs(ctx, c.RESTConfig, []*apiextensionsv1.CustomResourceDefinition{legacy}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	old := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "socialweb.computer/v1alpha1", "kind": "Secret",
		"metadata": map[string]any{"name": "owner-password", "namespace": "default", "labels": map[string]any{"app": "kept"}},
		"type":     "password", "data": map[string]any{"password": base64.StdEncoding.EncodeToString([]byte("hunter2-old"))}}}
	gvr := schema.GroupVersionResource{Group: "socialweb.computer", Version: "v1alpha1", Resource: "secrets"}
	if _, err := dyn.Resource(gvr).Namespace("default").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Stop()

	c = start(crds)
	defer c.Stop()
	cs, err := kubernetes.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	s, err := cs.CoreV1().Secrets("default").Get(ctx, "owner-password", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the old Secret was not moved to core/v1: %v", err)
	}
	if string(s.Data["password"]) != "hunter2-old" || s.Type != "password" || s.Labels["app"] != "kept" {
		t.Fatalf("moved Secret: type %q labels %v data %q", s.Type, s.Labels, s.Data)
	}
	ext, err := apiextensionsclient.NewForConfig(c.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the old CRD gone", func() (bool, error) {
		_, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, core.LegacySecretsCRD, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}
