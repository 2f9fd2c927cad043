package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

const tenantFlowObjects = `apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {name: e2e-level}
spec:
  type: Limited
  limited:
    nominalConcurrencyShares: 5
    limitResponse: {type: Reject}
---
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: e2e-schema}
spec:
  priorityLevelConfiguration: {name: e2e-level}
  matchingPrecedence: 5000
  rules:
  - subjects:
    - kind: Group
      group: {name: e2e-group}
    resourceRules:
    - verbs: ["get"]
      apiGroups: [""]
      resources: ["configmaps"]
      namespaces: ["default"]
`

// A tenant cluster serves flowcontrol.apiserver.k8s.io (FlowSchemas and
// PriorityLevelConfigurations), as Kubernetes clients and the conformance suite expect: the
// mandatory objects are listed, and the owner creates, reads and deletes their own.
func TestTenant_FlowControlAPI(t *testing.T) {
	requireTenantHost(t)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	c := coreClient(t, dir)
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Cluster
metadata: {name: fc1, namespace: default}
spec: {account: "`+tenantOwner+`", name: fc1, running: true}
`, "apply", "-f", "-")
	cl := waitPhase(t, c, client.ObjectKey{Namespace: "default", Name: "fc1"}, v1alpha1.ClusterReady, 60*time.Second)
	kc := mint(t, dir, cl)

	if out, err := tkubectlErr(kc, "api-resources", "--api-group=flowcontrol.apiserver.k8s.io", "-o", "name"); err != nil ||
		!strings.Contains(out, "flowschemas") || !strings.Contains(out, "prioritylevelconfigurations") {
		t.Fatalf("flowcontrol resources: %v %q", err, out)
	}
	// The apiserver writes the mandatory and suggested objects before it is ready.
	fs := tkubectl(t, kc, "", "get", "flowschemas,prioritylevelconfigurations", "-o", "name")
	for _, want := range []string{"flowschema.flowcontrol.apiserver.k8s.io/exempt", "flowschema.flowcontrol.apiserver.k8s.io/catch-all",
		"flowschema.flowcontrol.apiserver.k8s.io/global-default", "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/workload-low"} {
		if !strings.Contains(fs, want) {
			t.Errorf("flowcontrol objects lack %s:\n%s", want, fs)
		}
	}
	tkubectl(t, kc, tenantFlowObjects, "create", "-f", "-")
	if out := tkubectl(t, kc, "", "get", "flowschema", "e2e-schema", "-o", "jsonpath={.spec.priorityLevelConfiguration.name}"); out != "e2e-level" {
		t.Errorf("the created FlowSchema reads %q", out)
	}
	tkubectl(t, kc, "", "delete", "flowschema", "e2e-schema")
	tkubectl(t, kc, "", "delete", "prioritylevelconfiguration", "e2e-level")
	if out, err := tkubectlErr(kc, "get", "flowschema", "e2e-schema"); err == nil || !strings.Contains(err.Error(), "NotFound") {
		t.Errorf("after delete: %q %v", out, err)
	}
}
