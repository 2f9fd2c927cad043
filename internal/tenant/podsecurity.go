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

// AdmissionConfig is the apiserver's admission configuration for a cluster enforcing level:
// PodSecurity enforces it by default and warns and audits restricted, exempting no user,
// namespace or runtime class; the floor plugin enforces the same level regardless of
// namespace labels.
func AdmissionConfig(level PodSecurityLevel) []byte {
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
`, level, FloorPluginName)
}

// writeAdmissionConfig writes the cluster's admission configuration for level.
func writeAdmissionConfig(l Layout, level PodSecurityLevel) error {
	if err := os.MkdirAll(filepath.Dir(l.AdmissionConfig()), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(l.AdmissionConfig(), AdmissionConfig(level), 0o600)
}
