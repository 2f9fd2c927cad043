package repos

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	api "k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/config/crd"
	"socialweb.computer/internal/pds"
)

// readmeClusterYAML is the YAML that README.md's "Run on your cluster" applies (its heredoc),
// with the shell's "$APP_PASSWORD" done for password.
func readmeClusterYAML(t *testing.T, password string) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\n## Run on your cluster\n.*?cat <<YAML \| kubectl apply -f -\n(.*?)\nYAML\n`).FindSubmatch(b)
	if m == nil {
		t.Fatal(`README.md has no "Run on your cluster" heredoc`)
	}
	sub := regexp.MustCompile(`\$APP_PASSWORD\b`)
	if !sub.Match(m[1]) {
		t.Fatal("the heredoc no longer expands $APP_PASSWORD as this test expects")
	}
	y := sub.ReplaceAllLiteralString(string(m[1]), password)
	if strings.Contains(y, "$") {
		t.Fatalf("the heredoc has a shell expansion this test does not do:\n%s", y)
	}
	return strings.Split(y, "\n---\n")
}

// checkAgainstCRD validates obj as the API server would on create: unknown fields (which it
// would drop), the OpenAPI schema and the CEL rules of the kind's CRD.
func checkAgainstCRD(t *testing.T, crds []*apiextensionsv1.CustomResourceDefinition, gvk schema.GroupVersionKind, obj map[string]any) field.ErrorList {
	t.Helper()
	var v1 *apiextensionsv1.CustomResourceDefinition
	for _, c := range crds {
		if c.Spec.Group == gvk.Group && c.Spec.Names.Kind == gvk.Kind {
			v1 = c
		}
	}
	if v1 == nil {
		t.Fatalf("no CRD for %s", gvk)
	}
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatal(err)
	}
	var errs field.ErrorList
	pruned := runtime.DeepCopyJSON(obj)
	for _, p := range pruning.PruneWithOptions(pruned, s, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true}) {
		errs = append(errs, field.Invalid(field.NewPath(p), nil, "unknown field: the API server drops it"))
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(internal)
	if err != nil {
		t.Fatal(err)
	}
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, validator)...)
	celErrs, _ := cel.NewValidator(s, true, celconfig.PerCallLimit).Validate(context.Background(), nil, s, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// coreSecretAsStored is a core/v1 Secret document as kube-apiserver stores it: converted to
// the internal version (stringData merged into data), validated, and converted back.
func coreSecretAsStored(t *testing.T, i int, doc string) *corev1.Secret {
	t.Helper()
	var in corev1.Secret
	if err := yaml.UnmarshalStrict([]byte(doc), &in); err != nil {
		t.Fatalf("document %d (Secret): %v", i, err)
	}
	var internal api.Secret
	if err := legacyscheme.Scheme.Convert(&in, &internal, nil); err != nil {
		t.Fatalf("document %d (Secret): %v", i, err)
	}
	internal.Namespace = "default"
	for _, e := range corevalidation.ValidateSecret(&internal) {
		t.Errorf("document %d (Secret): %v", i, e)
	}
	out := &corev1.Secret{}
	if err := legacyscheme.Scheme.Convert(&internal, out, nil); err != nil {
		t.Fatalf("document %d (Secret): %v", i, err)
	}
	return out
}

// TestREADMEClusterRepoWorksAsWritten: the Secret and AtprotoRepo the README tells a cluster
// user to apply are valid against the CRDs and the Go types, and, with service pointed at a
// PDS holding that account, log in: the identifier, the credentialsRef and the Secret's key
// fit together as written.
func TestREADMEClusterRepoWorksAsWritten(t *testing.T) {
	const password = "abcd-efgh-ijkl-mnop"
	docs := readmeClusterYAML(t, password)
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	var repo *v1alpha1.AtprotoRepo
	for i, doc := range docs {
		var u map[string]any
		if err := yaml.Unmarshal([]byte(doc), &u); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		gv, err := schema.ParseGroupVersion(fmt.Sprint(u["apiVersion"]))
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		gvk := gv.WithKind(fmt.Sprint(u["kind"]))
		if gvk == corev1.SchemeGroupVersion.WithKind("Secret") {
			objs = append(objs, coreSecretAsStored(t, i, doc))
			continue
		}
		if gv != v1alpha1.GroupVersion {
			t.Fatalf("document %d: %s is not of %s", i, gvk, v1alpha1.GroupVersion)
		}
		o, err := scheme.New(gvk)
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), o); err != nil {
			t.Fatalf("document %d (%s): %v", i, gvk.Kind, err)
		}
		for _, e := range checkAgainstCRD(t, crds, gvk, u) {
			t.Errorf("document %d (%s): %v", i, gvk.Kind, e)
		}
		co := o.(client.Object)
		co.SetNamespace("default")
		objs = append(objs, co)
		if r, ok := o.(*v1alpha1.AtprotoRepo); ok {
			repo = r
		}
	}
	if repo == nil || repo.Spec.Remote == nil {
		t.Fatalf("the README's cluster YAML has no remote AtprotoRepo")
	}

	ctx := context.Background()
	srv, err := pds.New(pds.Config{DataDir: t.TempDir(), UserDomains: []string{".bsky.social"},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	did, err := srv.CreateAccount(ctx, repo.Spec.Remote.Identifier, password)
	if err != nil {
		t.Fatalf("account %s: %v", repo.Spec.Remote.Identifier, err)
	}
	repo.Spec.Remote.Service = srv.URL() // the user's PDS, here
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	r, err := (&Resolver{Client: c}).Connect(ctx, repo)
	if err != nil || r.DID() != did {
		t.Fatalf("the README's repo does not log in: %v", err)
	}
}
