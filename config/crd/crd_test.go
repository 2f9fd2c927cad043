package crd

import (
	"context"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
)

// wantKinds maps each CRD name to its kind.
var wantKinds = map[string]string{
	"atprotorecords.socialweb.computer":            "AtprotoRecord",
	"atprotorecordwatches.socialweb.computer":      "AtprotoRecordWatch",
	"atprotorepos.socialweb.computer":              "AtprotoRepo",
	"clusters.socialweb.computer":                  "Cluster",
	"computecontracts.socialweb.computer":          "ComputeContract",
	"ephemeralinfracollections.socialweb.computer": "EphemeralInfraCollection",
	"ephemeralinfras.socialweb.computer":           "EphemeralInfra",
	"gatewayaccesses.socialweb.computer":           "GatewayAccess",
	"infracollections.socialweb.computer":          "InfraCollection",
	"infras.socialweb.computer":                    "Infra",
	"nodeclaims.socialweb.computer":                "NodeClaim",
}

// noStatus lists the kinds without a status subresource: GatewayAccess is the operator's
// list, read by the gateway, which reconciles nothing.
var noStatus = map[string]bool{"GatewayAccess": true}

func TestCRDs(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(crds) != len(wantKinds) {
		t.Fatalf("got %d CRDs, want %d", len(crds), len(wantKinds))
	}
	for i, crd := range crds {
		if i > 0 && crds[i-1].Name >= crd.Name {
			t.Errorf("CRDs not sorted by name: %s before %s", crds[i-1].Name, crd.Name)
		}
		kind, ok := wantKinds[crd.Name]
		if !ok {
			t.Errorf("unexpected CRD %s", crd.Name)
			continue
		}
		if crd.Spec.Names.Kind != kind {
			t.Errorf("%s: kind %q, want %q", crd.Name, crd.Spec.Names.Kind, kind)
		}
		if crd.Spec.Group != "socialweb.computer" {
			t.Errorf("%s: group %q", crd.Name, crd.Spec.Group)
		}
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
			t.Errorf("%s: scope %q, want Namespaced", crd.Name, crd.Spec.Scope)
		}
		if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != "v1alpha1" ||
			!crd.Spec.Versions[0].Served || !crd.Spec.Versions[0].Storage {
			t.Errorf("%s: want one served storage version v1alpha1", crd.Name)
			continue
		}
		hasStatus := crd.Spec.Versions[0].Subresources != nil && crd.Spec.Versions[0].Subresources.Status != nil
		if hasStatus == noStatus[kind] {
			t.Errorf("%s: status subresource %v, want %v", crd.Name, hasStatus, !noStatus[kind])
		}
	}
}

// TestCRDsValid runs the API server's own CRD validation, which also compiles
// every x-kubernetes-validations rule and checks its estimated cost.
func TestCRDsValid(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, v1 := range crds {
		// What the API server does before validating: apply the v1 defaults
		// and record the storage version.
		v1 = v1.DeepCopy()
		apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(v1)
		v1.Status.StoredVersions = []string{"v1alpha1"}
		internal := &apiextensions.CustomResourceDefinition{}
		if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(v1, internal, nil); err != nil {
			t.Fatalf("%s: convert: %v", v1.Name, err)
		}
		for _, e := range validation.ValidateCustomResourceDefinition(context.Background(), internal) {
			t.Errorf("%s: %v", v1.Name, e)
		}
	}
}
