package tenant

import (
	"fmt"
	"os"
	"path/filepath"

	"socialweb.computer/internal/atomicfile"
)

// PodSecurityLevel is a Pod Security Standards level a tenant cluster enforces on every pod.
// Privileged is not one: a tenant's pods run on a provider's machine, so the floor is baseline.
type PodSecurityLevel string

const (
	PodSecurityBaseline   PodSecurityLevel = "baseline"
	PodSecurityRestricted PodSecurityLevel = "restricted"
)

// FloorPluginName is the admission plugin every tenant apiserver runs after PodSecurity: it
// enforces the cluster's level on every pod whatever its namespace's labels say, and refuses
// PersistentVolumes that mount a node's own filesystem. The owner is cluster-admin and can
// label a namespace privileged or delete any admission policy object; a compiled-in plugin
// configured from a file in the provider's data dir is out of their reach.
const FloorPluginName = "TenantPodSecurityFloor"

// ParsePodSecurityLevel reads an operator's or owner's level; "" is baseline.
func ParsePodSecurityLevel(s string) (PodSecurityLevel, error) {
	switch PodSecurityLevel(s) {
	case "", PodSecurityBaseline:
		return PodSecurityBaseline, nil
	case PodSecurityRestricted:
		return PodSecurityRestricted, nil
	}
	return "", fmt.Errorf("pod security level %q: want %s or %s (privileged is never offered to tenants)", s, PodSecurityBaseline, PodSecurityRestricted)
}

// Stricter is the stricter of two levels ("" counts as baseline): the operator sets a floor
// and an owner may only tighten it.
func Stricter(a, b PodSecurityLevel) PodSecurityLevel {
	if a == PodSecurityRestricted || b == PodSecurityRestricted {
		return PodSecurityRestricted
	}
	return PodSecurityBaseline
}

// PodUserNamespaces says whether a tenant cluster runs every pod in a user namespace of its
// own (hostUsers: false), so that uid 0 in a pod is an unprivileged uid of the node's host.
type PodUserNamespaces string

const (
	// PodUserNamespacesRequired: the floor sets hostUsers: false on every new pod that does
	// not say, and refuses one that asks for hostUsers: true. Nodes must run such pods (the
	// node runtime, docs/nodes.md), and the cluster's node contracts require the layer.
	PodUserNamespacesRequired PodUserNamespaces = "required"
	// PodUserNamespacesOptional: a pod gets a user namespace when it asks (hostUsers: false)
	// and runs with the host's uids otherwise.
	PodUserNamespacesOptional PodUserNamespaces = "optional"
)

// ParsePodUserNamespaces reads an operator's or owner's choice; "" is optional (the owner
// said nothing; the operator's floor then decides).
func ParsePodUserNamespaces(s string) (PodUserNamespaces, error) {
	switch PodUserNamespaces(s) {
	case "", PodUserNamespacesOptional:
		return PodUserNamespacesOptional, nil
	case PodUserNamespacesRequired:
		return PodUserNamespacesRequired, nil
	}
	return "", fmt.Errorf("pod user namespaces %q: want %s or %s", s, PodUserNamespacesRequired, PodUserNamespacesOptional)
}

// PodUserNamespacesAuto is an operator's choice that follows the local nodes: required when
// the nodes this process rents out run pods in user namespaces, else optional.
const PodUserNamespacesAuto = "auto"

// ChoosePodUserNamespaces is the operator's floor from its flag (required, optional or auto)
// and whether the local node bidder's nodes run pods in user namespaces (with why not), and
// the reason for the choice.
func ChoosePodUserNamespaces(flag string, localNodesRunThem bool, whyNot string) (PodUserNamespaces, string, error) {
	switch flag {
	case "", PodUserNamespacesAuto:
		if localNodesRunThem {
			return PodUserNamespacesRequired, "auto: the local node bidder's nodes run them", nil
		}
		return PodUserNamespacesOptional, "auto: the local node bidder's nodes do not run them (" + whyNot + ")", nil
	}
	u, err := ParsePodUserNamespaces(flag)
	if err != nil {
		return "", "", fmt.Errorf("--pod-user-namespaces: %w (or %s)", err, PodUserNamespacesAuto)
	}
	return u, "set by --pod-user-namespaces", nil
}

// PodPolicy is what a cluster's floor enforces on every pod.
type PodPolicy struct {
	Level          PodSecurityLevel
	UserNamespaces PodUserNamespaces
}

// Tighten is the stricter of an operator's floor and an owner's choice in each part: an owner
// may tighten, never loosen.
func Tighten(floor, owner PodPolicy) PodPolicy {
	p := PodPolicy{Level: Stricter(floor.Level, owner.Level), UserNamespaces: PodUserNamespacesOptional}
	if floor.UserNamespaces == PodUserNamespacesRequired || owner.UserNamespaces == PodUserNamespacesRequired {
		p.UserNamespaces = PodUserNamespacesRequired
	}
	return p
}

// AdmissionConfig is the apiserver's admission configuration for a cluster enforcing p:
// PodSecurity enforces p's level by default and warns and audits restricted, exempting no
// user, namespace or runtime class; the floor plugin enforces the same level regardless of
// namespace labels, and p's user namespaces.
func AdmissionConfig(p PodPolicy) []byte {
	p = Tighten(p, PodPolicy{})
	return fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: PodSecurity
  configuration:
    apiVersion: pod-security.admission.config.k8s.io/v1
    kind: PodSecurityConfiguration
    defaults:
      enforce: %[1]s
      enforce-version: latest
      audit: restricted
      audit-version: latest
      warn: restricted
      warn-version: latest
    exemptions:
      usernames: []
      runtimeClasses: []
      namespaces: []
- name: %[2]s
  configuration:
    level: %[1]s
    userNamespaces: %[3]s
`, p.Level, FloorPluginName, p.UserNamespaces)
}

// writeAdmissionConfig writes the cluster's admission configuration for p.
func writeAdmissionConfig(l Layout, p PodPolicy) error {
	if err := os.MkdirAll(filepath.Dir(l.AdmissionConfig()), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(l.AdmissionConfig(), AdmissionConfig(p), 0o600)
}
