package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	ctrlmanager "socialweb.computer/internal/controllers/manager"
)

const (
	namespace      = "socialweb-system"
	serviceAccount = "socialweb-controllers"
	controllerRole = "socialweb-controllers"
	electionRole   = "socialweb-leader-election"
)

// wantArgs are the Deployment's arguments, exactly.
var wantArgs = []string{"controllers", "--leader-elect", "--leader-elect-namespace=$(POD_NAMESPACE)",
	"--health-addr=:8081", "--metrics-addr=:8443", "--metrics-secure"}

// build is the decoded output of `kubectl kustomize`.
type build struct {
	namespaces   []*corev1.Namespace
	crds         []*apiextensionsv1.CustomResourceDefinition
	accounts     []*corev1.ServiceAccount
	clusterRoles map[string]*rbacv1.ClusterRole
	roles        map[string]*rbacv1.Role
	crBindings   []*rbacv1.ClusterRoleBinding
	rBindings    []*rbacv1.RoleBinding
	deployments  []*appsv1.Deployment
	services     []*corev1.Service
}

// kustomize builds dir with kubectl (hack/install-test-deps.sh installs it) and decodes
// every object strictly: a field the API does not have is an error, not a silent drop.
func kustomize(t *testing.T, dir string) *build {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl is not installed; hack/install-test-deps.sh installs it")
		}
		t.Skip("kubectl is not installed (hack/install-test-deps.sh installs it)")
	}
	var stderr bytes.Buffer
	cmd := exec.Command("kubectl", "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	b, err := decode(out)
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	return b
}

func decode(out []byte) (*build, error) {
	b := &build{clusterRoles: map[string]*rbacv1.ClusterRole{}, roles: map[string]*rbacv1.Role{}}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, err
		}
		var obj any
		switch head.Kind {
		case "":
			continue
		case "Namespace":
			o := &corev1.Namespace{}
			b.namespaces, obj = append(b.namespaces, o), o
		case "CustomResourceDefinition":
			o := &apiextensionsv1.CustomResourceDefinition{}
			b.crds, obj = append(b.crds, o), o
		case "ServiceAccount":
			o := &corev1.ServiceAccount{}
			b.accounts, obj = append(b.accounts, o), o
		case "ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "Role":
			obj = &rbacv1.Role{}
		case "ClusterRoleBinding":
			o := &rbacv1.ClusterRoleBinding{}
			b.crBindings, obj = append(b.crBindings, o), o
		case "RoleBinding":
			o := &rbacv1.RoleBinding{}
			b.rBindings, obj = append(b.rBindings, o), o
		case "Deployment":
			o := &appsv1.Deployment{}
			b.deployments, obj = append(b.deployments, o), o
		case "Service":
			o := &corev1.Service{}
			b.services, obj = append(b.services, o), o
		default:
			return nil, fmt.Errorf("unexpected kind %s in the build", head.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			return nil, fmt.Errorf("decode %s: %w", head.Kind, err)
		}
		// Roles are looked up by name, once it is decoded.
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			b.clusterRoles[o.Name] = o
		case *rbacv1.Role:
			b.roles[o.Name] = o
		}
	}
}

// TestKustomization builds config/default as `kubectl apply -k` would and checks it holds
// every CRD, the controllers' namespace, account, roles and bindings, all in one namespace.
func TestKustomization(t *testing.T) {
	b := kustomize(t, "default")

	bases, err := filepath.Glob("crd/bases/*.yaml")
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRD bases: %v", err)
	}
	if len(b.crds) != len(bases) {
		t.Errorf("%d CRDs in the build, %d files in crd/bases: list every one in crd/kustomization.yaml", len(b.crds), len(bases))
	}
	if len(b.namespaces) != 1 || b.namespaces[0].Name != namespace {
		t.Errorf("want the one Namespace %s, got %d", namespace, len(b.namespaces))
	}
	if len(b.accounts) != 1 || b.accounts[0].Name != serviceAccount || b.accounts[0].Namespace != namespace {
		t.Errorf("want the one ServiceAccount %s/%s", namespace, serviceAccount)
	}
	for _, name := range []string{controllerRole, "socialweb-metrics-auth", "socialweb-metrics-reader"} {
		if b.clusterRoles[name] == nil {
			t.Errorf("no ClusterRole %s", name)
		}
	}
	if r := b.roles[electionRole]; r == nil || r.Namespace != namespace {
		t.Errorf("no Role %s in %s", electionRole, namespace)
	}
	for _, o := range b.deployments {
		if o.Namespace != namespace {
			t.Errorf("Deployment %s in namespace %q", o.Name, o.Namespace)
		}
	}
	for _, o := range b.services {
		if o.Namespace != namespace {
			t.Errorf("Service %s in namespace %q", o.Name, o.Namespace)
		}
	}

	// Every binding binds our account to a role of the build; the controllers' role, the
	// election role and the metrics filter's role are each bound.
	bound := map[string]bool{}
	checkSubjects := func(what string, subjects []rbacv1.Subject) {
		if len(subjects) != 1 || subjects[0].Kind != rbacv1.ServiceAccountKind ||
			subjects[0].Name != serviceAccount || subjects[0].Namespace != namespace {
			t.Errorf("%s: subjects %+v, want the ServiceAccount %s/%s only", what, subjects, namespace, serviceAccount)
		}
	}
	for _, rb := range b.crBindings {
		checkSubjects("ClusterRoleBinding "+rb.Name, rb.Subjects)
		if rb.RoleRef.Kind != "ClusterRole" || b.clusterRoles[rb.RoleRef.Name] == nil {
			t.Errorf("ClusterRoleBinding %s: roleRef %+v is no ClusterRole of the build", rb.Name, rb.RoleRef)
		}
		bound["ClusterRole/"+rb.RoleRef.Name] = true
	}
	for _, rb := range b.rBindings {
		checkSubjects("RoleBinding "+rb.Name, rb.Subjects)
		if rb.Namespace != namespace || rb.RoleRef.Kind != "Role" || b.roles[rb.RoleRef.Name] == nil {
			t.Errorf("RoleBinding %s/%s: roleRef %+v is no Role of the build in its namespace", rb.Namespace, rb.Name, rb.RoleRef)
		}
		bound["Role/"+rb.RoleRef.Name] = true
	}
	for _, want := range []string{"ClusterRole/" + controllerRole, "ClusterRole/socialweb-metrics-auth", "Role/" + electionRole} {
		if !bound[want] {
			t.Errorf("%s is not bound to the controllers' ServiceAccount", want)
		}
	}
	// The reader role is for the scraper, never for the controllers themselves.
	if bound["ClusterRole/socialweb-metrics-reader"] {
		t.Error("socialweb-metrics-reader is bound to the controllers' ServiceAccount")
	}
}

// deployment returns the build's one Deployment and its one container.
func deployment(t *testing.T, b *build) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	if len(b.deployments) != 1 {
		t.Fatalf("%d Deployments in the build, want 1", len(b.deployments))
	}
	d := b.deployments[0]
	if len(d.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("Deployment %s: %d containers, want 1", d.Name, len(d.Spec.Template.Spec.Containers))
	}
	return d, &d.Spec.Template.Spec.Containers[0]
}

// TestDeployment checks the Deployment of `socialweb controllers`: two replicas electing a
// leader in their own namespace, the probes and metrics ports, resources and the account.
func TestDeployment(t *testing.T) {
	b := kustomize(t, "default")
	d, c := deployment(t, b)
	pod := d.Spec.Template.Spec

	if d.Name != "socialweb-controllers" || d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("Deployment %s: want socialweb-controllers with 2 replicas", d.Name)
	}
	if c.Image != "socialweb.computer/socialweb:local" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image %s (%s), want socialweb.computer/socialweb:local (IfNotPresent)", c.Image, c.ImagePullPolicy)
	}
	if len(c.Command) != 0 || !slices.Equal(c.Args, wantArgs) {
		t.Errorf("command %q args %q, want args %q", c.Command, c.Args, wantArgs)
	}
	// From the downward API: the namespace of the Lease, and the pod's name and UID that
	// make its holder identity (ctrlmanager.leaseIdentity).
	for name, field := range map[string]string{"POD_NAMESPACE": "metadata.namespace",
		ctrlmanager.PodNameEnv: "metadata.name", ctrlmanager.PodUIDEnv: "metadata.uid"} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.FieldRef == nil || c.Env[i].ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("%s is not the pod's %s from the downward API: %v", name, field, c.Env)
		}
	}
	if pod.ServiceAccountName != serviceAccount {
		t.Errorf("serviceAccountName %q, want %s", pod.ServiceAccountName, serviceAccount)
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds <= 0 {
		t.Error("terminationGracePeriodSeconds is not set")
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	probe := func(what string, p *corev1.Probe, path string) {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: no HTTP probe", what)
		case p.HTTPGet.Path != path:
			t.Errorf("%s: path %s, want %s", what, p.HTTPGet.Path, path)
		case p.HTTPGet.Port.IntValue() != 8081 && ports[p.HTTPGet.Port.String()] != 8081:
			t.Errorf("%s: port %s is not 8081 (--health-addr)", what, p.HTTPGet.Port.String())
		}
	}
	probe("livenessProbe", c.LivenessProbe, "/healthz")
	probe("readinessProbe", c.ReadinessProbe, "/readyz")

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, ok := c.Resources.Requests[r]
		if !ok || req.IsZero() {
			t.Errorf("no %s request", r)
			continue
		}
		if lim, ok := c.Resources.Limits[r]; !ok || lim.Cmp(req) < 0 {
			t.Errorf("%s limit missing or below the request", r)
		}
	}

	if len(b.services) != 1 {
		t.Fatalf("%d Services in the build, want the metrics Service", len(b.services))
	}
	s := b.services[0]
	if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 8443 {
		t.Fatalf("Service %s: ports %+v, want 8443", s.Name, s.Spec.Ports)
	}
	if tp := s.Spec.Ports[0].TargetPort; tp.IntValue() != 8443 && ports[tp.String()] != 8443 {
		t.Errorf("Service %s targets %s, not the container's 8443 (--metrics-addr)", s.Name, tp.String())
	}
	for k, v := range s.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Service %s selects %s=%s, which the pods do not carry", s.Name, k, v)
		}
	}
}

// TestRestrictedPodSecurity evaluates the Deployment's pod with the Pod Security admission
// library against the policy its namespace's labels enforce, which must be restricted, and
// checks what the restricted profile leaves optional but this Deployment promises.
func TestRestrictedPodSecurity(t *testing.T) {
	b := kustomize(t, "default")
	d, c := deployment(t, b)
	if len(b.namespaces) != 1 {
		t.Fatalf("%d Namespaces in the build", len(b.namespaces))
	}
	pol, errs := psaapi.PolicyToEvaluate(b.namespaces[0].Labels, psaapi.Policy{})
	if len(errs) > 0 {
		t.Fatalf("namespace labels: %v", errs)
	}
	if pol.Enforce.Level != psaapi.LevelRestricted {
		t.Errorf("namespace %s enforces %s, want restricted", b.namespaces[0].Name, pol.Enforce.String())
	}
	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lv := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	res := policy.AggregateCheckResults(eval.EvaluatePod(lv, &d.Spec.Template.ObjectMeta, &d.Spec.Template.Spec))
	if !res.Allowed {
		t.Errorf("the pod breaks the restricted profile: %s: %s", res.ForbiddenReason(), res.ForbiddenDetail())
	}

	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the container has no securityContext")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Error("runAsUser is not 65532")
	}
}

// TestDeploymentFlags runs the binary's `controllers --help` and checks every flag the
// Deployment passes is one it has. It needs the binary (SOCIALWEB_TEST_BIN, as the test
// command builds it).
func TestDeploymentFlags(t *testing.T) {
	bin := os.Getenv("SOCIALWEB_TEST_BIN")
	if bin == "" {
		t.Skip("SOCIALWEB_TEST_BIN is not set (hack/build.sh bin/socialweb builds it)")
	}
	out, err := exec.Command(bin, "controllers", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s controllers --help: %v\n%s", bin, err, out)
	}
	have := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
		have[m[1]] = true
	}
	for _, a := range wantArgs[1:] {
		name := strings.TrimPrefix(strings.SplitN(a, "=", 2)[0], "--")
		if !have[name] {
			t.Errorf("the Deployment passes --%s, which `socialweb controllers` does not have", name)
		}
	}
}

// access is one verb on one resource of one group, in a namespace ("" for the ClusterRole).
type access struct{ namespace, role, group, resource, verb string }

func (a access) String() string {
	return fmt.Sprintf("%s %s/%s in %q (%s)", a.verb, a.group, a.resource, a.namespace, a.role)
}

var (
	markerLine = regexp.MustCompile(`^//\s*\+kubebuilder:rbac:(.*)$`)
	// blocking finds owner references that block their owner's deletion:
	// controllerutil.SetControllerReference and SetOwnerReference set it, and so does a
	// literal true.
	blocking = regexp.MustCompile(`SetControllerReference\(|SetOwnerReference\(|BlockOwnerDeletion:\s*(ptr\(true\)|&\w*[Tt]rue|ptr\.To\(true\))`)
)

// markers reads every +kubebuilder:rbac marker under the given directories (Go files, not
// tests) and returns what they grant, and the packages they are in.
func markers(t *testing.T, dirs ...string) (map[access]bool, map[string]bool) {
	t.Helper()
	got, pkgs := map[access]bool{}, map[string]bool{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(data), "\n") {
				m := markerLine.FindStringSubmatch(strings.TrimSpace(line))
				if m == nil {
					continue
				}
				args := map[string][]string{}
				for _, kv := range strings.Split(m[1], ",") {
					k, v, _ := strings.Cut(kv, "=")
					for _, x := range strings.Split(v, ";") {
						args[k] = append(args[k], strings.Trim(x, `"`))
					}
				}
				if len(args["urls"]) > 0 {
					t.Errorf("%s: marker grants non-resource URLs: %s", path, line)
				}
				ns, role := args["namespace"], args["roleName"]
				a := access{}
				if len(ns) > 0 {
					a.namespace = ns[0]
				}
				if a.role = controllerRole; len(role) > 0 {
					a.role = role[0]
				}
				for _, a.group = range args["groups"] {
					for _, a.resource = range args["resources"] {
						for _, a.verb = range args["verbs"] {
							got[a] = true
						}
					}
				}
				pkgs[filepath.Dir(path)] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return got, pkgs
}

// rules expands rules into the accesses they grant.
func rules(ns, role string, rs []rbacv1.PolicyRule) map[access]bool {
	out := map[access]bool{}
	for _, r := range rs {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out[access{ns, role, g, res, v}] = true
				}
			}
		}
	}
	return out
}

func diff(a, b map[access]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k.String())
		}
	}
	sort.Strings(out)
	return out
}

// TestControllerRoles checks the generated roles (rbac/role.yaml) against the markers they
// come from, without running controller-gen: every access granted is asked for by a marker
// on a reconciler (or on NewControllers for leader election) and every marker's access is
// granted; nothing is a wildcard; the controllers' ClusterRole stays within our API group.
// It also checks every controller `socialweb controllers` sets up carries markers.
func TestControllerRoles(t *testing.T) {
	data, err := os.ReadFile("rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.clusterRoles) != 1 || b.clusterRoles[controllerRole] == nil || len(b.roles) != 1 || b.roles[electionRole] == nil {
		t.Fatalf("role.yaml: want the ClusterRole %s and the Role %s, got %d ClusterRoles and %d Roles",
			controllerRole, electionRole, len(b.clusterRoles), len(b.roles))
	}
	granted := rules("", controllerRole, b.clusterRoles[controllerRole].Rules)
	for k := range rules(namespace, electionRole, b.roles[electionRole].Rules) {
		granted[k] = true
	}
	asked, pkgs := markers(t, "../internal/controllers", "../internal/app")
	if d := diff(granted, asked); len(d) > 0 {
		t.Errorf("role.yaml grants what no marker asks for (run go generate ./config/rbac/...):\n%s", strings.Join(d, "\n"))
	}
	if d := diff(asked, granted); len(d) > 0 {
		t.Errorf("markers ask for what role.yaml does not grant (run go generate ./config/rbac/...):\n%s", strings.Join(d, "\n"))
	}

	for _, cr := range b.clusterRoles {
		for _, r := range cr.Rules {
			if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
				t.Errorf("ClusterRole %s: rule %+v names URLs or resource names", cr.Name, r)
			}
		}
	}
	for a := range granted {
		if strings.Contains(a.group+a.resource+a.verb, "*") {
			t.Errorf("wildcard: %s", a)
		}
		switch a.verb {
		case "get", "list", "watch", "create", "update", "patch", "delete":
		default:
			t.Errorf("verb %s beyond reading and writing objects: %s", a.verb, a)
		}
		if a.namespace == "" && a.group != "socialweb.computer" && (a.group != "" || a.resource != "secrets") {
			t.Errorf("the controllers' ClusterRole reaches outside socialweb.computer and core Secrets: %s", a)
		}
	}

	// No rule grants <kind>/finalizers: every owner reference the controllers set has
	// blockOwnerDeletion false. One that sets it true needs update on the owner's
	// finalizers subresource where OwnerReferencesPermissionEnforcement is on (OpenShift,
	// hardened clusters), or its creates are refused there.
	err = filepath.WalkDir("../internal/controllers", func(path string, e os.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if blocking.Match(data) {
			t.Errorf("%s sets an owner reference that blocks its owner's deletion: add update on <owner>/finalizers to its markers and to this check", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for a := range granted {
		if strings.HasSuffix(a.resource, "/finalizers") {
			t.Errorf("%s: nothing sets a blocking owner reference (see above)", a)
		}
	}

	// Every controller package NewControllers sets up carries markers, but the node host:
	// it runs only with tenant control planes (ControllerOptions.Tenants), which
	// `socialweb controllers` never has.
	src, err := os.ReadFile("../internal/app/controllers.go")
	if err != nil {
		t.Fatal(err)
	}
	setups := regexp.MustCompile(`\b([a-z]+)\.Setup\(m,`).FindAllStringSubmatch(string(src), -1)
	if len(setups) == 0 {
		t.Fatal("no Setup calls found in internal/app/controllers.go")
	}
	for _, m := range setups {
		if m[1] == "nodehost" {
			continue
		}
		if dir := filepath.Join("../internal/controllers", m[1]); !pkgs[dir] {
			t.Errorf("%s is set up by NewControllers but has no +kubebuilder:rbac markers", dir)
		}
	}
}

// TestMetricsRoles checks the hand-written metrics roles grant exactly what
// controller-runtime's authentication and authorization filter and a scraper need.
func TestMetricsRoles(t *testing.T) {
	b := kustomize(t, "rbac")
	auth := b.clusterRoles["socialweb-metrics-auth"]
	reader := b.clusterRoles["socialweb-metrics-reader"]
	if auth == nil || reader == nil {
		t.Fatal("missing socialweb-metrics-auth or socialweb-metrics-reader")
	}
	got := diff(rules("", auth.Name, auth.Rules), nil)
	want := []string{
		`create authentication.k8s.io/tokenreviews in "" (socialweb-metrics-auth)`,
		`create authorization.k8s.io/subjectaccessreviews in "" (socialweb-metrics-auth)`,
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("socialweb-metrics-auth grants %q, want %q", got, want)
	}
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) ||
		!slices.Equal(reader.Rules[0].Verbs, []string{"get"}) || len(reader.Rules[0].Resources) > 0 {
		t.Errorf("socialweb-metrics-reader: %+v, want get on /metrics only", reader.Rules)
	}
}
