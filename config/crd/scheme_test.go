package crd

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"socialweb.computer/api/v1alpha1"
)

// TestCRDsMatchScheme checks, without running controller-gen, that every kind
// registered by api/v1alpha1 has a checked-in CRD and every CRD a registered
// kind: a kind added or removed without go generate ./api/... fails here.
// hack/verify-generated.sh is the full check (it regenerates and diffs).
func TestCRDsMatchScheme(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	// AddToScheme also registers the meta/v1 option kinds; keep this package's own.
	pkg := reflect.TypeFor[v1alpha1.Infra]().PkgPath()
	registered := map[string]bool{}
	for gvk, typ := range s.AllKnownTypes() {
		if gvk.GroupVersion() != v1alpha1.GroupVersion || typ.PkgPath() != pkg || strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		registered[gvk.Kind] = true
	}
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	inCRDs := map[string]bool{}
	for _, c := range crds {
		inCRDs[c.Spec.Names.Kind] = true
		if !registered[c.Spec.Names.Kind] {
			t.Errorf("CRD %s has kind %s, which api/v1alpha1 does not register", c.Name, c.Spec.Names.Kind)
		}
		if c.Spec.Group != v1alpha1.GroupVersion.Group {
			t.Errorf("CRD %s: group %s, want %s", c.Name, c.Spec.Group, v1alpha1.GroupVersion.Group)
		}
	}
	for k := range registered {
		if !inCRDs[k] {
			t.Errorf("kind %s is registered but has no CRD in bases/; run go generate ./api/...", k)
		}
	}
}
