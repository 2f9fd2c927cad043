package kube

import (
	"context"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/kubernetes/pkg/apis/certificates"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/kubernetes/pkg/apis/core"

	"socialweb.computer/internal/tenant/volumes"
)

func floorFor(t *testing.T, level string) *floor {
	t.Helper()
	f, err := newFloor(strings.NewReader("level: " + level))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func podAttributes(pod, old *core.Pod, subresource string) admission.Attributes {
	op := admission.Create
	var oldObj runtime.Object
	if old != nil {
		op, oldObj = admission.Update, old
	}
	return admission.NewAttributesRecord(pod, oldObj, core.Kind("Pod").WithVersion("v1"), "default", pod.Name,
		core.Resource("pods").WithVersion("v1"), subresource, op, nil, false, &user.DefaultInfo{Name: "did:plc:owner"})
}

func pod(name string, mutate func(*core.Pod)) *core.Pod {
	p := &core.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec:       core.PodSpec{Containers: []core.Container{{Name: "c", Image: "busybox"}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func restrictedPod(name string) *core.Pod {
	no, yes := false, true
	return pod(name, func(p *core.Pod) {
		p.Spec.SecurityContext = &core.PodSecurityContext{RunAsNonRoot: &yes, SeccompProfile: &core.SeccompProfile{Type: core.SeccompProfileTypeRuntimeDefault}}
		p.Spec.Containers[0].SecurityContext = &core.SecurityContext{
			AllowPrivilegeEscalation: &no,
			Capabilities:             &core.Capabilities{Drop: []core.Capability{"ALL"}},
		}
	})
}

// Each pod a tenant could use to reach the node's host, refused at the baseline floor,
// whatever the namespace's labels; a plain pod is admitted.
func TestFloor_Pods(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		level string
		pod   *core.Pod
		allow bool
		why   string
	}{
		{"baseline", pod("plain", nil), true, ""},
		{"baseline", pod("privileged", func(p *core.Pod) {
			p.Spec.Containers[0].SecurityContext = &core.SecurityContext{Privileged: &yes}
		}), false, "privileged"},
		{"baseline", pod("hostpath", func(p *core.Pod) {
			p.Spec.Volumes = []core.Volume{{Name: "root", VolumeSource: core.VolumeSource{HostPath: &core.HostPathVolumeSource{Path: "/"}}}}
		}), false, "hostPath"},
		{"baseline", pod("hostpid", func(p *core.Pod) {
			p.Spec.HostPID = true
		}), false, "hostPID"},
		{"baseline", pod("hostnetwork", func(p *core.Pod) {
			p.Spec.HostNetwork = true
		}), false, "hostNetwork"},
		{"baseline", pod("sysadmin", func(p *core.Pod) {
			p.Spec.Containers[0].SecurityContext = &core.SecurityContext{Capabilities: &core.Capabilities{Add: []core.Capability{"SYS_ADMIN"}}}
		}), false, "SYS_ADMIN"},
		{"baseline", pod("labelled-privileged", func(p *core.Pod) {
			p.Labels = map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}
			p.Spec.Containers[0].SecurityContext = &core.SecurityContext{Privileged: &yes}
		}), false, "privileged"},
		{"restricted", pod("plain", nil), false, "allowPrivilegeEscalation"},
		{"restricted", restrictedPod("restricted"), true, ""},
	} {
		err := floorFor(t, tc.level).Validate(context.Background(), podAttributes(tc.pod, nil, ""), nil)
		if tc.allow {
			if err != nil {
				t.Errorf("%s/%s: refused: %v", tc.level, tc.pod.Name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), `violates PodSecurity "`+tc.level) {
			t.Errorf("%s/%s: %v; want a refusal naming %s", tc.level, tc.pod.Name, err, tc.why)
		}
	}
}

// An ephemeral container is checked like any other: a privileged debug container is refused.
func TestFloor_EphemeralContainer(t *testing.T) {
	yes := true
	old := pod("running", nil)
	withDebug := pod("running", func(p *core.Pod) {
		p.Spec.EphemeralContainers = []core.EphemeralContainer{{EphemeralContainerCommon: core.EphemeralContainerCommon{
			Name: "debug", Image: "busybox", SecurityContext: &core.SecurityContext{Privileged: &yes}}}}
	})
	err := floorFor(t, "baseline").Validate(context.Background(), podAttributes(withDebug, old, "ephemeralcontainers"), nil)
	if err == nil || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("privileged ephemeral container: %v, want refused", err)
	}
}

// An in-place resize of a pod passes: nodes' kubelets keep a cgroup per pod and resize it.
func TestFloor_InPlaceResize(t *testing.T) {
	old := pod("running", nil)
	resized := pod("running", func(p *core.Pod) {
		p.Spec.Containers[0].Resources.Requests = core.ResourceList{core.ResourceCPU: resource.MustParse("150m")}
	})
	if err := floorFor(t, "baseline").Validate(context.Background(), podAttributes(resized, old, "resize"), nil); err != nil {
		t.Errorf("resize: %v, want allowed", err)
	}
	if err := floorFor(t, "baseline").Validate(context.Background(), podAttributes(pod("running", nil), old, "status"), nil); err != nil {
		t.Errorf("a status update: %v", err)
	}
}

// A PersistentVolume on a node's own filesystem is refused: a claim on it would pass any
// Pod Security level.
func TestFloor_PersistentVolumes(t *testing.T) {
	f := floorFor(t, "baseline")
	for _, tc := range []struct {
		name   string
		source core.PersistentVolumeSource
		refuse string
	}{
		{"hostpath", core.PersistentVolumeSource{HostPath: &core.HostPathVolumeSource{Path: "/"}}, "hostPath"},
		{"local", core.PersistentVolumeSource{Local: &core.LocalVolumeSource{Path: "/var/lib"}}, "local"},
		{"nfs", core.PersistentVolumeSource{NFS: &core.NFSVolumeSource{Server: "192.0.2.1", Path: "/x"}}, ""},
	} {
		pv := &core.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: tc.name}, Spec: core.PersistentVolumeSpec{PersistentVolumeSource: tc.source}}
		a := admission.NewAttributesRecord(pv, nil, core.Kind("PersistentVolume").WithVersion("v1"), "", tc.name,
			core.Resource("persistentvolumes").WithVersion("v1"), "", admission.Create, nil, false, &user.DefaultInfo{Name: "did:plc:owner"})
		err := f.Validate(context.Background(), a, nil)
		if tc.refuse == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), "spec."+tc.refuse) {
			t.Errorf("%s: %v, want refused naming spec.%s", tc.name, err, tc.refuse)
		}
	}
}

// The local-path provisioner's own volume passes; the very same volume from the cluster's
// admin, from someone impersonating the provisioner's user (no proof, or a wrong one), or a
// volume of the provisioner's that leaves its directory, is refused.
func TestFloor_ProvisionedVolumes(t *testing.T) {
	f := floorFor(t, "baseline")
	f.provisionerProof = "the-proof"
	doc := core.HostPathDirectoryOrCreate
	hostPath := func(name, path string) *core.PersistentVolume {
		return &core.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: core.PersistentVolumeSpec{
			PersistentVolumeSource: core.PersistentVolumeSource{HostPath: &core.HostPathVolumeSource{Path: path, Type: &doc}}}}
	}
	provisioner := &user.DefaultInfo{Name: volumes.ProvisionerUser, Extra: map[string][]string{volumes.ProofExtraKey: {"the-proof"}}}
	for _, tc := range []struct {
		name  string
		pv    *core.PersistentVolume
		old   *core.PersistentVolume
		user  user.Info
		allow bool
	}{
		{"the provisioner's volume", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil, provisioner, true},
		{"the same volume from the owner", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil, &user.DefaultInfo{Name: "did:plc:owner"}, false},
		{"the provisioner's name without the proof", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil, &user.DefaultInfo{Name: volumes.ProvisionerUser}, false},
		{"the provisioner's name with a wrong proof", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil,
			&user.DefaultInfo{Name: volumes.ProvisionerUser, Extra: map[string][]string{volumes.ProofExtraKey: {"guess"}}}, false},
		{"the proof under another name", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil,
			&user.DefaultInfo{Name: "did:plc:owner", Extra: map[string][]string{volumes.ProofExtraKey: {"the-proof"}}}, false},
		{"the provisioner, out of the directory", hostPath("pvc-1", volumes.NodeDir+"/../pvc-1"), nil, provisioner, false},
		{"the provisioner, the host's root", hostPath("pvc-1", "/"), nil, provisioner, false},
		{"the provisioner, a local volume", &core.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"}, Spec: core.PersistentVolumeSpec{
			PersistentVolumeSource: core.PersistentVolumeSource{Local: &core.LocalVolumeSource{Path: volumes.NodeDir + "/pvc-1"}}}}, nil, provisioner, false},
		{"an update keeping the source (binding)", hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), hostPath("pvc-1", volumes.NodeDir+"/pvc-1"),
			&user.DefaultInfo{Name: "system:kube-controller-manager"}, true},
		{"an update changing the source", hostPath("pvc-1", "/"), hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), &user.DefaultInfo{Name: "did:plc:owner"}, false},
	} {
		op := admission.Create
		var old runtime.Object
		if tc.old != nil {
			op, old = admission.Update, tc.old
		}
		a := admission.NewAttributesRecord(tc.pv, old, core.Kind("PersistentVolume").WithVersion("v1"), "", tc.pv.Name,
			core.Resource("persistentvolumes").WithVersion("v1"), "", op, nil, false, tc.user)
		err := f.Validate(context.Background(), a, nil)
		if tc.allow && err != nil {
			t.Errorf("%s: refused: %v", tc.name, err)
		}
		if !tc.allow && (err == nil || !strings.Contains(err.Error(), "node's own filesystem")) {
			t.Errorf("%s: %v, want refused", tc.name, err)
		}
	}
	// A floor without a proof (none configured) lets no node-filesystem volume through.
	f.provisionerProof = ""
	a := admission.NewAttributesRecord(hostPath("pvc-1", volumes.NodeDir+"/pvc-1"), nil, core.Kind("PersistentVolume").WithVersion("v1"), "", "pvc-1",
		core.Resource("persistentvolumes").WithVersion("v1"), "", admission.Create, nil, false, &user.DefaultInfo{Name: volumes.ProvisionerUser, Extra: map[string][]string{volumes.ProofExtraKey: {""}}})
	if err := f.Validate(context.Background(), a, nil); err == nil {
		t.Error("an empty proof let a volume through")
	}
}

func TestFloor_Config(t *testing.T) {
	for _, bad := range []string{"level: privileged", "levl: baseline", "level: [x]"} {
		if _, err := newFloor(strings.NewReader(bad)); err == nil {
			t.Errorf("config %q accepted", bad)
		}
	}
	if f, err := newFloor(nil); err != nil || f.level != "baseline" {
		t.Errorf("no config: %v %v, want baseline", f, err)
	}
}

func TestRegisterFloor_OrderedAfterPodSecurity(t *testing.T) {
	plugins := admission.NewPlugins()
	order := registerFloor(plugins, []string{"NamespaceLifecycle", "PodSecurity", "Priority"}, "proof")
	if strings.Join(order, ",") != "NamespaceLifecycle,PodSecurity,TenantPodSecurityFloor,Priority" {
		t.Errorf("order %v", order)
	}
	registered := strings.Join(plugins.Registered(), ",")
	if registered != "TenantPodSecurityFloor" {
		t.Errorf("registered %s", registered)
	}
}

// A client certificate of the cluster is asked through the CSR API only by a node (its own
// renewal) or the control plane: a member's, or a ServiceAccount's, would outlive
// revokeIdentity. Other signers pass.
func TestFloor_ClientCertificateRequests(t *testing.T) {
	f := floorFor(t, "baseline")
	member := &user.DefaultInfo{Name: "did:plc:member", Groups: []string{user.AllAuthenticated}}
	sa := &user.DefaultInfo{Name: "system:serviceaccount:default:backdoor", Groups: []string{user.AllAuthenticated, "system:serviceaccounts"}}
	nodeN1 := &user.DefaultInfo{Name: "system:node:n1", Groups: []string{user.NodesGroup, user.AllAuthenticated}}
	admin := &user.DefaultInfo{Name: "system:kube-controller-manager", Groups: []string{user.SystemPrivilegedGroup}}
	for _, tc := range []struct {
		name    string
		signer  string
		who     user.Info
		refused bool
	}{
		{"a member asks for a client certificate", certificates.KubeAPIServerClientSignerName, member, true},
		{"a member asks for a kubelet client certificate", certificates.KubeAPIServerClientKubeletSignerName, member, true},
		{"a ServiceAccount asks for a client certificate", certificates.KubeAPIServerClientSignerName, sa, true},
		{"a node renews its client certificate", certificates.KubeAPIServerClientKubeletSignerName, nodeN1, false},
		{"a node asks for a user's client certificate", certificates.KubeAPIServerClientSignerName, nodeN1, true},
		{"the control plane", certificates.KubeAPIServerClientSignerName, admin, false},
		{"a kubelet serving certificate", certificates.KubeletServingSignerName, member, false},
		{"a signer of the member's own", "example.com/e2e", member, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csr := &certificates.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: certificates.CertificateSigningRequestSpec{SignerName: tc.signer}}
			a := admission.NewAttributesRecord(csr, nil, certificates.Kind("CertificateSigningRequest").WithVersion("v1"), "", csr.Name,
				certificates.Resource("certificatesigningrequests").WithVersion("v1"), "", admission.Create, nil, false, tc.who)
			err := f.Validate(context.Background(), a, nil)
			if refused := err != nil; refused != tc.refused || refused && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), ErrClientCertificateRequest.Error())) {
				t.Errorf("%s by %s: %v, want refused %v", tc.signer, tc.who.GetName(), err, tc.refused)
			}
		})
	}
}

// In a cluster that requires user namespaces, a new pod that does not say gets hostUsers:
// false, one that asks for the host's uids is refused, and updates and subresources of pods
// (which cannot change hostUsers) pass; a cluster that does not require them changes nothing.
func TestFloor_UserNamespaces(t *testing.T) {
	yes, no := true, false
	required, err := newFloor(strings.NewReader("level: baseline\nuserNamespaces: required"))
	if err != nil {
		t.Fatal(err)
	}
	optional := floorFor(t, "baseline")
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		floor     *floor
		pod       *core.Pod
		old       *core.Pod
		sub       string
		want      *bool // hostUsers after Admit
		forbidden bool
		why       string // in the refusal; default: the user namespace
	}{
		{name: "unset is defaulted to false", floor: required, pod: pod("plain", nil), want: &no},
		{name: "false is kept", floor: required, pod: pod("userns", func(p *core.Pod) { p.Spec.HostUsers = &no }), want: &no},
		{name: "true is refused", floor: required, pod: pod("host", func(p *core.Pod) { p.Spec.HostUsers = &yes }), want: &yes, forbidden: true},
		{name: "a pod asking for a host namespace is left to Pod Security", floor: required, pod: pod("hostpid", func(p *core.Pod) { p.Spec.HostPID = true }), want: nil, forbidden: true, why: "host namespaces"},
		{name: "an update of a pod made before is left alone", floor: required, pod: pod("old", nil), old: pod("old", nil), want: nil},
		{name: "a subresource is left alone", floor: required, pod: pod("eph", nil), sub: "ephemeralcontainers", want: nil},
		{name: "optional: unset stays unset", floor: optional, pod: pod("plain", nil), want: nil},
		{name: "optional: true is allowed", floor: optional, pod: pod("host", func(p *core.Pod) { p.Spec.HostUsers = &yes }), want: &yes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := podAttributes(tc.pod, tc.old, tc.sub)
			if err := tc.floor.Admit(ctx, a, nil); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			got := tc.pod.Spec.HostUsers
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("hostUsers after Admit = %v, want %v", got, tc.want)
			}
			err := tc.floor.Validate(ctx, a, nil)
			if tc.forbidden != (err != nil) {
				t.Fatalf("Validate: %v, forbidden want %v", err, tc.forbidden)
			}
			why := tc.why
			if why == "" {
				why = "user namespace of its own"
			}
			if tc.forbidden && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), why)) {
				t.Fatalf("Validate: %v, want Forbidden naming %q", err, why)
			}
		})
	}
	if _, err := newFloor(strings.NewReader("level: baseline\nuserNamespaces: sometimes")); err == nil {
		t.Fatal("a floor configuration with userNamespaces: sometimes was accepted")
	}
}
