package crd

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// celCheck evaluates the x-kubernetes-validations rules of one CRD against an
// object (and, for an update, its old version) the way the API server does,
// returning the error messages.
func celCheck(t *testing.T, crdName, obj, old string) []string {
	t.Helper()
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var v1 *apiextensionsv1.CustomResourceDefinition
	for _, c := range crds {
		if c.Name == crdName {
			v1 = c
		}
	}
	if v1 == nil {
		t.Fatalf("no CRD %s", crdName)
	}
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1.Spec.Versions[0].Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := schema.NewStructural(internal)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(y string) any {
		if y == "" {
			return nil
		}
		var m map[string]any
		if err := yaml.Unmarshal([]byte(y), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	errs, remaining := cel.NewValidator(s, true, celconfig.PerCallLimit).
		Validate(context.Background(), nil, s, decode(obj), decode(old), celconfig.RuntimeCELCostBudget)
	if remaining < 0 {
		t.Fatalf("%s: runtime CEL budget exceeded", crdName)
	}
	var msgs []string
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	return msgs
}

func wantCEL(t *testing.T, msgs []string, want string) {
	t.Helper()
	if want == "" {
		if len(msgs) != 0 {
			t.Errorf("want no errors, got %q", msgs)
		}
		return
	}
	for _, m := range msgs {
		if strings.Contains(m, want) {
			return
		}
	}
	t.Errorf("want an error containing %q, got %q", want, msgs)
}

func TestInfraContractNamesUnique(t *testing.T) {
	for _, crd := range []string{"infras.socialweb.computer", "ephemeralinfras.socialweb.computer"} {
		wantCEL(t, celCheck(t, crd, `
spec:
  contracts: [{name: a}, {name: b}]
`, ""), "")
		wantCEL(t, celCheck(t, crd, `
spec:
  contracts: [{name: a}, {name: b}, {name: a}]
`, ""), "contract names must be unique")
	}

	// The largest list allowed stays within the runtime budget.
	var b strings.Builder
	b.WriteString("spec:\n  contracts:\n")
	for i := range 64 {
		fmt.Fprintf(&b, "  - name: %s-%02d\n", strings.Repeat("x", 60), i)
	}
	wantCEL(t, celCheck(t, "infras.socialweb.computer", b.String(), ""), "")
}

func TestAtprotoRepoExactlyOneSource(t *testing.T) {
	const crd = "atprotorepos.socialweb.computer"
	const msg = "exactly one of local or remote must be set"
	wantCEL(t, celCheck(t, crd, `spec: {local: {account: alice.test}}`, ""), "")
	wantCEL(t, celCheck(t, crd, `spec: {remote: {service: "https://pds.test", identifier: alice.test, credentialsRef: {name: alice}}}`, ""), "")
	wantCEL(t, celCheck(t, crd, `spec: {}`, ""), msg)
	wantCEL(t, celCheck(t, crd, `spec: {local: {account: a}, remote: {service: "https://pds.test", identifier: b, credentialsRef: {name: b}}}`, ""), msg)
}

func TestClusterIdentityImmutable(t *testing.T) {
	const crd = "clusters.socialweb.computer"
	const old = `spec: {account: "did:plc:alice", name: dev}`
	wantCEL(t, celCheck(t, crd, `spec: {account: "did:plc:alice", name: dev, running: true}`, old), "")
	wantCEL(t, celCheck(t, crd, `spec: {account: "did:plc:bob", name: dev}`, old), "account is immutable")
	wantCEL(t, celCheck(t, crd, `spec: {account: "did:plc:alice", name: prod}`, old), "name is immutable")
}
