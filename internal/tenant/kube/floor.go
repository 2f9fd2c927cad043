package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/certificates"
	"k8s.io/kubernetes/pkg/apis/core"
	_ "k8s.io/kubernetes/pkg/apis/core/install" // the core/v1 conversions
	podsecurityadmission "k8s.io/pod-security-admission/admission"
	podsecurityconfig "k8s.io/pod-security-admission/admission/api"
	podsecurityapi "k8s.io/pod-security-admission/api"
	podsecuritymetrics "k8s.io/pod-security-admission/metrics"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/tenant/volumes"
)

// registerFloor registers the tenant Pod Security floor (tenant.FloorPluginName) with the
// apiserver's admission plugins, ordered right after PodSecurity. proof is the local-path
// provisioner's (provisionerSecrets): the node-filesystem volumes it makes pass the floor.
func registerFloor(plugins *admission.Plugins, order []string, proof string) []string {
	plugins.Register(tenant.FloorPluginName, func(config io.Reader) (admission.Interface, error) {
		f, err := newFloor(config)
		if err != nil {
			return nil, err
		}
		f.provisionerProof = proof
		return f, nil
	})
	out := make([]string, 0, len(order)+1)
	for _, name := range order {
		out = append(out, name)
		if name == "PodSecurity" {
			out = append(out, tenant.FloorPluginName)
		}
	}
	return out
}

// floor enforces one Pod Security level on every pod of the cluster. It is the upstream Pod
// Security evaluation (k8s.io/pod-security-admission) told that every namespace is
// unlabelled and nothing is exempt, so neither a namespace label nor any object the
// cluster's admin can write loosens it. It also refuses PersistentVolumes that mount a
// node's own filesystem (hostPath, local): a pod using such a volume through a claim passes
// every Pod Security level. The one exception is the local-path provisioner's own volumes
// (volumes.CheckProvisioned), made under its in-process identity.
type floor struct {
	*admission.Handler
	level    podsecurityapi.Level
	delegate *podsecurityadmission.Admission
	// provisionerProof is the value the local-path provisioner's requests carry; "" lets
	// no node-filesystem volume through.
	provisionerProof string
	// userNamespaces: every pod runs with hostUsers: false (tenant.PodUserNamespacesRequired);
	// Admit defaults it and Validate refuses hostUsers: true (floor_userns.go).
	userNamespaces bool
}

var _ admission.ValidationInterface = (*floor)(nil)

type floorConfig struct {
	Level          string `json:"level"`
	UserNamespaces string `json:"userNamespaces"`
}

func newFloor(config io.Reader) (*floor, error) {
	var c floorConfig
	if config != nil {
		b, err := io.ReadAll(config)
		if err != nil {
			return nil, err
		}
		if err := yaml.UnmarshalStrict(b, &c); err != nil {
			return nil, fmt.Errorf("%s configuration: %w", tenant.FloorPluginName, err)
		}
	}
	level, err := tenant.ParsePodSecurityLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("%s configuration: %w", tenant.FloorPluginName, err)
	}
	userns, err := tenant.ParsePodUserNamespaces(c.UserNamespaces)
	if err != nil {
		return nil, fmt.Errorf("%s configuration: %w", tenant.FloorPluginName, err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return nil, err
	}
	delegate := &podsecurityadmission.Admission{
		Configuration: &podsecurityconfig.PodSecurityConfiguration{
			// Warnings and audit annotations are PodSecurity's (restricted); this plugin
			// only enforces, so they are not repeated.
			Defaults: podsecurityconfig.PodSecurityDefaults{
				Enforce: string(level), EnforceVersion: podsecurityapi.VersionLatest,
				Audit: string(podsecurityapi.LevelPrivileged), AuditVersion: podsecurityapi.VersionLatest,
				Warn: string(podsecurityapi.LevelPrivileged), WarnVersion: podsecurityapi.VersionLatest,
			},
		},
		Evaluator:        evaluator,
		Metrics:          noMetrics{},
		PodSpecExtractor: podsecurityadmission.DefaultPodSpecExtractor{},
		NamespaceGetter:  unlabelledNamespaces{},
		// Only read when a namespace's labels change, which the floor does not evaluate.
		PodLister: noPods{},
	}
	if err := delegate.CompleteConfiguration(); err != nil {
		return nil, err
	}
	if err := delegate.ValidateConfiguration(); err != nil {
		return nil, err
	}
	return &floor{
		Handler:        admission.NewHandler(admission.Create, admission.Update),
		level:          podsecurityapi.Level(level),
		delegate:       delegate,
		userNamespaces: userns == tenant.PodUserNamespacesRequired,
	}, nil
}

func (f *floor) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	switch a.GetResource().GroupResource() {
	case core.Resource("pods"):
		result := f.delegate.ValidatePod(ctx, &v1PodAttributes{Attributes: a})
		if result.Allowed {
			return f.validateHostUsers(a)
		}
		msg := "not allowed by PodSecurity"
		if result.Result != nil && result.Result.Message != "" {
			msg = result.Result.Message
		}
		return admission.NewForbidden(a, fmt.Errorf("%s (this cluster's provider enforces Pod Security %q on every pod, whatever the namespace's labels)", msg, f.level))
	case certificates.Resource("certificatesigningrequests"):
		csr, ok := a.GetObject().(*certificates.CertificateSigningRequest)
		if !ok || a.GetOperation() != admission.Create || a.GetSubresource() != "" {
			return nil
		}
		if err := clientCertificateRequest(csr.Spec.SignerName, a.GetUserInfo()); err != nil {
			return admission.NewForbidden(a, err)
		}
	case core.Resource("persistentvolumes"):
		pv, ok := a.GetObject().(*core.PersistentVolume)
		if !ok || a.GetSubresource() != "" {
			return nil
		}
		source := nodeFilesystemSource(pv)
		if source == "" {
			return nil
		}
		// The volume source cannot change after creation: an update that keeps it (the
		// controller-manager binding the claim, a label) concerns a volume admitted before.
		if old, ok := a.GetOldObject().(*core.PersistentVolume); ok && a.GetOperation() == admission.Update &&
			nodeFilesystemSource(old) == source && apiequality.Semantic.DeepEqual(old.Spec.PersistentVolumeSource, pv.Spec.PersistentVolumeSource) {
			return nil
		}
		if err := provisionedVolume(pv, hasProof(a.GetUserInfo(), f.provisionerProof)); err != nil {
			return admission.NewForbidden(a, fmt.Errorf("spec.%s mounts a node's own filesystem, which a tenant cluster's volumes may not (%v): use a claim of StorageClass %s", source, err, volumes.StorageClassName))
		}
	}
	return nil
}

// ErrClientCertificateRequest refuses a CertificateSigningRequest for a client certificate
// of this cluster from anyone but its own nodes and control plane. A client certificate
// cannot be taken back (the apiserver checks no revocation list), so one a member signed
// for themselves through the CSR API (cluster-admin may approve its own request) would
// outlive revokeIdentity. Client certificates come from the gateway, which gives them a
// lifetime and knows whose they are.
var ErrClientCertificateRequest = errors.New("client certificates of this cluster come from its gateway (`socialweb cluster kubeconfig`, or the getKubeconfig call), which dates them and knows whose they are; through the CSR API only a node renews its own")

// clientCertificateRequest is nil when u may ask for a certificate of signer: a signer
// that does not issue this cluster's client certificates, or the kubelet's client signer
// asked by a node (its renewal) or the control plane (system:masters).
func clientCertificateRequest(signer string, u user.Info) error {
	switch signer {
	case certificates.KubeAPIServerClientSignerName, certificates.KubeAPIServerClientKubeletSignerName:
	default:
		return nil
	}
	groups := u.GetGroups()
	if slices.Contains(groups, user.SystemPrivilegedGroup) {
		return nil
	}
	if signer == certificates.KubeAPIServerClientKubeletSignerName && slices.Contains(groups, user.NodesGroup) && strings.HasPrefix(u.GetName(), "system:node:") {
		return nil
	}
	return fmt.Errorf("%w (signer %s, requested by %s)", ErrClientCertificateRequest, signer, u.GetName())
}

// provisionedVolume is nil when pv is exactly a volume the local-path provisioner makes and
// the request is the provisioner's.
func provisionedVolume(pv *core.PersistentVolume, fromProvisioner bool) error {
	hp := pv.Spec.HostPath
	if hp == nil || pv.Spec.Local != nil {
		return fmt.Errorf("%w: a local volume", volumes.ErrNotProvisioned)
	}
	typ := ""
	if hp.Type != nil {
		typ = string(*hp.Type)
	}
	return volumes.CheckProvisioned(pv.Name, hp.Path, typ, fromProvisioner)
}

// nodeFilesystemSource names the volume source of pv that is a path on the node, or "".
func nodeFilesystemSource(pv *core.PersistentVolume) string {
	switch {
	case pv.Spec.HostPath != nil:
		return "hostPath"
	case pv.Spec.Local != nil:
		return "local"
	}
	return ""
}

// unlabelledNamespaces answers every namespace as having no Pod Security labels, so the
// floor's defaults are the policy everywhere.
type unlabelledNamespaces struct{}

func (unlabelledNamespaces) GetNamespace(_ context.Context, name string) (*corev1.Namespace, error) {
	return &corev1.Namespace{}, nil
}

type noPods struct{}

func (noPods) ListPods(context.Context, string) ([]*corev1.Pod, error) { return nil, nil }

// v1PodAttributes presents the apiserver's internal Pod objects as core/v1, as the Pod
// Security library reads them.
type v1PodAttributes struct {
	admission.Attributes
	once     sync.Once
	obj, old runtime.Object
	err      error
}

func (a *v1PodAttributes) convert() {
	a.obj, a.err = toV1Pod(a.Attributes.GetObject())
	if a.err == nil {
		a.old, a.err = toV1Pod(a.Attributes.GetOldObject())
	}
}

func (a *v1PodAttributes) GetObject() (runtime.Object, error) {
	a.once.Do(a.convert)
	return a.obj, a.err
}

func (a *v1PodAttributes) GetOldObject() (runtime.Object, error) {
	a.once.Do(a.convert)
	return a.old, a.err
}

func (a *v1PodAttributes) GetOperation() admissionv1.Operation {
	return admissionv1.Operation(a.Attributes.GetOperation())
}

func (a *v1PodAttributes) GetUserName() string { return a.GetUserInfo().GetName() }

func toV1Pod(in runtime.Object) (runtime.Object, error) {
	if in == nil {
		return nil, nil
	}
	pod, ok := in.(*core.Pod)
	if !ok {
		return nil, errors.New("unexpected object for pods: " + fmt.Sprintf("%T", in))
	}
	out := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(pod, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

type noMetrics struct{}

func (noMetrics) RecordEvaluation(podsecuritymetrics.Decision, podsecurityapi.LevelVersion, podsecuritymetrics.Mode, podsecurityapi.Attributes) {
}
func (noMetrics) RecordExemption(podsecurityapi.Attributes)   {}
func (noMetrics) RecordError(bool, podsecurityapi.Attributes) {}
