// Package volumes is a tenant cluster's local storage: the default StorageClass local-path and
// its provisioner, which runs in the control plane's process and makes, for a claim the
// scheduler placed on a node, a hostPath PersistentVolume in one fixed directory of that node
// (NodeDir/<volume>), bound to the node. The decisions are pure functions of the objects
// (table-tested); provisioner.go reads the cluster, calls them and applies what they say.
//
// The tenant Pod Security floor refuses every hostPath and local PersistentVolume except the
// ones this provisioner makes (CheckProvisioned, and the proof its in-process identity
// carries): see docs/volumes.md and docs/security.md.
package volumes

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// ProvisionerName is the provisioner of the StorageClass local-path and of its volumes
	// (annotation pv.kubernetes.io/provisioned-by).
	ProvisionerName = "socialweb.computer/local-path"
	// StorageClassName is every tenant cluster's default StorageClass.
	StorageClassName = "local-path"
	// NodeDir is the directory, inside every node, that holds the volumes: one directory per
	// volume, named after it. A node's own directory backs it (docs/volumes.md).
	NodeDir = "/var/lib/socialweb/volumes"

	// ProvisionerUser is the provisioner's user name in the tenant apiserver. The name alone
	// proves nothing (the cluster's admin can impersonate it or have a certificate signed for
	// it): the apiserver adds ProofExtraKey with a value only the control plane process
	// knows to requests that carry its in-process token.
	ProvisionerUser = "socialweb:local-path-provisioner"
	// ProofExtraKey is the user extra that carries that value.
	ProofExtraKey = "socialweb.computer/local-path-proof"
	// ClusterRoleName is the provisioner's ClusterRole and ClusterRoleBinding.
	ClusterRoleName = "socialweb:local-path-provisioner"

	// NamesAnnotation, on a Node, lists (comma-separated, sorted) the volumes the provisioner
	// made on it. The node removes every directory of NodeDir not listed there: how a
	// deleted volume's data leaves the node (docs/volumes.md).
	NamesAnnotation = "volumes.socialweb.computer/names"
	// NodeAnnotation, on a volume, names the node that holds its data.
	NodeAnnotation = "volumes.socialweb.computer/node"

	annSelectedNode       = "volume.kubernetes.io/selected-node"
	annProvisionedBy      = "pv.kubernetes.io/provisioned-by"
	annStorageProvisioner = "volume.kubernetes.io/storage-provisioner"
	annDefaultClass       = "storageclass.kubernetes.io/is-default-class"
	hostnameLabel         = "kubernetes.io/hostname"
)

// ErrNotProvisioned is why a node-filesystem PersistentVolume is refused: it is not one the
// provisioner makes.
var ErrNotProvisioned = errors.New("not a volume of the local-path provisioner")

// PathFor is the directory, inside its node, of the volume named pv.
func PathFor(pv string) string { return NodeDir + "/" + pv }

// CheckProvisioned says whether a hostPath volume named pvName with path and type is exactly
// what the provisioner makes: the directory NodeDir/<pvName>, one level deep, written
// without "..", ".", doubled or trailing slashes, of type DirectoryOrCreate. fromProvisioner
// is whether the request carries the provisioner's proof. It does not look at who may be
// asking otherwise: the same volume from anyone else is refused.
func CheckProvisioned(pvName, hostPath, hostPathType string, fromProvisioner bool) error {
	if !fromProvisioner {
		return fmt.Errorf("%w: only the provisioner (StorageClass %s) makes volumes on a node's own filesystem", ErrNotProvisioned, StorageClassName)
	}
	if errs := validation.IsDNS1123Subdomain(pvName); len(errs) > 0 {
		return fmt.Errorf("%w: volume name %q: %s", ErrNotProvisioned, pvName, strings.Join(errs, "; "))
	}
	if hostPath != PathFor(pvName) || path.Clean(hostPath) != hostPath {
		return fmt.Errorf("%w: path %q is not %s", ErrNotProvisioned, hostPath, PathFor(pvName))
	}
	if hostPathType != string(corev1.HostPathDirectoryOrCreate) {
		return fmt.Errorf("%w: type %q is not %s", ErrNotProvisioned, hostPathType, corev1.HostPathDirectoryOrCreate)
	}
	return nil
}

// StorageClass is the cluster's default StorageClass: volumes are made once a pod using the
// claim is scheduled (on that pod's node) and deleted with their claim.
func StorageClass() *storagev1.StorageClass {
	reclaim := corev1.PersistentVolumeReclaimDelete
	binding := storagev1.VolumeBindingWaitForFirstConsumer
	return &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClassName,
			Annotations: map[string]string{annDefaultClass: "true"},
		},
		Provisioner:       ProvisionerName,
		ReclaimPolicy:     &reclaim,
		VolumeBindingMode: &binding,
	}
}

// VolumeName is the name of the volume made for a claim.
func VolumeName(claim *corev1.PersistentVolumeClaim) string { return "pvc-" + string(claim.UID) }

// ClaimDecision is what to do with a claim.
type ClaimDecision struct {
	// Provision is the node to make its volume on; empty: nothing to do now.
	Provision string
	// Refuse, when set, is why the claim cannot be served (an event on the claim).
	Refuse string
}

// DecideClaim decides for a claim of class (nil: the class is not found) whose volume
// exists or not.
func DecideClaim(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, volumeExists bool) ClaimDecision {
	if claim.DeletionTimestamp != nil || claim.Spec.VolumeName != "" || volumeExists {
		return ClaimDecision{}
	}
	if class == nil || class.Provisioner != ProvisionerName {
		return ClaimDecision{}
	}
	if p := claim.Annotations[annStorageProvisioner]; p != "" && p != ProvisionerName {
		return ClaimDecision{}
	}
	node := claim.Annotations[annSelectedNode]
	if node == "" {
		// Immediate binding is not offered: a volume is on one node, so it waits for the
		// scheduler to place its first pod.
		return ClaimDecision{}
	}
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return ClaimDecision{Refuse: "volumeMode Block is not offered: a local-path volume is a directory"}
	}
	for _, m := range claim.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			return ClaimDecision{Refuse: fmt.Sprintf("access mode %s is not offered: a local-path volume is on one node (ReadWriteOnce, ReadWriteOncePod)", m)}
		}
	}
	if claim.Spec.DataSource != nil || claim.Spec.DataSourceRef != nil {
		return ClaimDecision{Refuse: "a data source is not offered: local-path volumes start empty"}
	}
	if claim.Spec.Selector != nil {
		return ClaimDecision{Refuse: "a selector is not offered for a provisioned volume"}
	}
	return ClaimDecision{Provision: node}
}

// NewVolume is the volume for claim of class on the node named node whose
// kubernetes.io/hostname label is hostname.
func NewVolume(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass, node, hostname string) *corev1.PersistentVolume {
	name := VolumeName(claim)
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	modes := claim.Spec.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	size := claim.Spec.Resources.Requests[corev1.ResourceStorage]
	if size.IsZero() {
		size = resource.MustParse("1Gi")
	}
	fs := corev1.PersistentVolumeFilesystem
	hpType := corev1.HostPathDirectoryOrCreate
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Annotations: map[string]string{
				annProvisionedBy: ProvisionerName,
				NodeAnnotation:   node,
			},
		},
		Spec: corev1.PersistentVolumeSpec{
			// Nothing is reserved on the node's disk: the size is the claim's, as asked.
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   modes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			VolumeMode:                    &fs,
			MountOptions:                  class.MountOptions,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID,
				ResourceVersion: claim.ResourceVersion,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: PathFor(name), Type: &hpType},
			},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
					Key: hostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{hostname},
				}}}},
			}},
		},
	}
}

// Ours says whether the provisioner made pv.
func Ours(pv *corev1.PersistentVolume) bool {
	return pv.Annotations[annProvisionedBy] == ProvisionerName && pv.Annotations[NodeAnnotation] != ""
}

// VolumeDecision is what to do with one of our volumes.
type VolumeDecision struct {
	// Delete: its claim is gone and its class says Delete.
	Delete bool
	// NodeGone: the node that held its data is gone, and the data with it.
	NodeGone bool
}

// DecideVolume decides for pv, given whether its node exists.
func DecideVolume(pv *corev1.PersistentVolume, nodeExists bool) VolumeDecision {
	if !Ours(pv) || pv.DeletionTimestamp != nil {
		return VolumeDecision{}
	}
	return VolumeDecision{
		Delete:   pv.Status.Phase == corev1.VolumeReleased && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete,
		NodeGone: !nodeExists,
	}
}

// NodeNames is the value of NamesAnnotation for node: the volumes of pvs on it, sorted.
// A volume being deleted is still listed: until it is gone a pod may use it.
func NodeNames(node string, pvs []*corev1.PersistentVolume) string {
	var names []string
	for _, pv := range pvs {
		if Ours(pv) && pv.Annotations[NodeAnnotation] == node {
			names = append(names, pv.Name)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

// ParseNames reads NamesAnnotation.
func ParseNames(v string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		if n != "" {
			out[n] = true
		}
	}
	return out
}
