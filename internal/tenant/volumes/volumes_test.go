package volumes

import (
	"errors"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"socialweb.computer/internal/substrate/node"
)

func TestCheckProvisioned(t *testing.T) {
	doc := string(corev1.HostPathDirectoryOrCreate)
	for _, tc := range []struct {
		name, pv, path, typ string
		proof               bool
		ok                  bool
	}{
		{"the provisioner's own volume", "pvc-1", NodeDir + "/pvc-1", doc, true, true},
		{"the same volume from anyone else", "pvc-1", NodeDir + "/pvc-1", doc, false, false},
		{"the volumes dir itself", "pvc-1", NodeDir, doc, true, false},
		{"another volume's dir", "pvc-1", NodeDir + "/pvc-2", doc, true, false},
		{"two levels deep", "pvc-1", NodeDir + "/pvc-1/x", doc, true, false},
		{"dot-dot out of the dir", "pvc-1", NodeDir + "/../pvc-1", doc, true, false},
		{"dot-dot as the name", "..", NodeDir + "/..", doc, true, false},
		{"dot segment", "pvc-1", NodeDir + "/./pvc-1", doc, true, false},
		{"doubled slash", "pvc-1", "/var/lib/socialweb//volumes/pvc-1", doc, true, false},
		{"trailing slash", "pvc-1", NodeDir + "/pvc-1/", doc, true, false},
		{"the host's root", "pvc-1", "/", doc, true, false},
		{"relative", "pvc-1", "var/lib/socialweb/volumes/pvc-1", doc, true, false},
		{"a socket type", "pvc-1", NodeDir + "/pvc-1", string(corev1.HostPathSocket), true, false},
		{"no type", "pvc-1", NodeDir + "/pvc-1", "", true, false},
		{"a name that is not a subdomain", "PVC_1", NodeDir + "/PVC_1", doc, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckProvisioned(tc.pv, tc.path, tc.typ, tc.proof)
			if (err == nil) != tc.ok {
				t.Fatalf("CheckProvisioned(%q, %q, %q, %v) = %v, want ok=%v", tc.pv, tc.path, tc.typ, tc.proof, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrNotProvisioned) {
				t.Fatalf("error %v is not ErrNotProvisioned", err)
			}
		})
	}
}

func claim(mut func(c *corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: "u1",
			Annotations: map[string]string{annSelectedNode: "node-a", annStorageProvisioner: ProvisionerName}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
		},
	}
	if mut != nil {
		mut(c)
	}
	return c
}

func TestDecideClaim(t *testing.T) {
	class := StorageClass()
	other := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "example.com/nfs"}
	block := corev1.PersistentVolumeBlock
	now := metav1.Now()
	for _, tc := range []struct {
		name    string
		claim   *corev1.PersistentVolumeClaim
		class   *storagev1.StorageClass
		exists  bool
		want    string
		refused bool
	}{
		{"placed by the scheduler", claim(nil), class, false, "node-a", false},
		{"not placed yet", claim(func(c *corev1.PersistentVolumeClaim) { delete(c.Annotations, annSelectedNode) }), class, false, "", false},
		{"volume already made", claim(nil), class, true, "", false},
		{"bound", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeName = "pv" }), class, false, "", false},
		{"being deleted", claim(func(c *corev1.PersistentVolumeClaim) { c.DeletionTimestamp = &now }), class, false, "", false},
		{"another provisioner's class", claim(nil), other, false, "", false},
		{"no such class", claim(nil), nil, false, "", false},
		{"another provisioner named on the claim", claim(func(c *corev1.PersistentVolumeClaim) { c.Annotations[annStorageProvisioner] = "x" }), class, false, "", false},
		{"ReadWriteOncePod", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		}), class, false, "node-a", false},
		{"ReadWriteMany refused", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		}), class, false, "", true},
		{"Block refused", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = &block }), class, false, "", true},
		{"data source refused", claim(func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "x"}
		}), class, false, "", true},
		{"selector refused", claim(func(c *corev1.PersistentVolumeClaim) { c.Spec.Selector = &metav1.LabelSelector{} }), class, false, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := DecideClaim(tc.claim, tc.class, tc.exists)
			if d.Provision != tc.want || (d.Refuse != "") != tc.refused {
				t.Fatalf("DecideClaim = %+v, want provision %q refused %v", d, tc.want, tc.refused)
			}
		})
	}
}

func TestNewVolumePassesItsOwnCheck(t *testing.T) {
	pv := NewVolume(claim(nil), StorageClass(), "node-a", "node-a")
	if pv.Name != "pvc-u1" || !Ours(pv) || pv.Annotations[NodeAnnotation] != "node-a" {
		t.Fatalf("volume %s annotations %v", pv.Name, pv.Annotations)
	}
	if err := CheckProvisioned(pv.Name, pv.Spec.HostPath.Path, string(*pv.Spec.HostPath.Type), true); err != nil {
		t.Fatal(err)
	}
	if pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || pv.Spec.ClaimRef.UID != "u1" {
		t.Fatalf("reclaim %s claimRef %+v", pv.Spec.PersistentVolumeReclaimPolicy, pv.Spec.ClaimRef)
	}
	if got := pv.Spec.Capacity[corev1.ResourceStorage]; got.String() != "2Gi" {
		t.Fatalf("capacity %s", got.String())
	}
	req := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
	if req.Key != hostnameLabel || req.Values[0] != "node-a" {
		t.Fatalf("node affinity %+v", req)
	}
}

func TestStorageClassIsTheDefault(t *testing.T) {
	c := StorageClass()
	if c.Annotations[annDefaultClass] != "true" || *c.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		*c.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete || c.Provisioner != ProvisionerName {
		t.Fatalf("%+v", c)
	}
}

func TestDecideVolume(t *testing.T) {
	ours := func(phase corev1.PersistentVolumePhase, reclaim corev1.PersistentVolumeReclaimPolicy) *corev1.PersistentVolume {
		pv := NewVolume(claim(nil), StorageClass(), "node-a", "node-a")
		pv.Status.Phase = phase
		pv.Spec.PersistentVolumeReclaimPolicy = reclaim
		return pv
	}
	foreign := &corev1.PersistentVolume{Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeReleased},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete}}
	for _, tc := range []struct {
		name       string
		pv         *corev1.PersistentVolume
		nodeExists bool
		want       VolumeDecision
	}{
		{"bound", ours(corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete), true, VolumeDecision{}},
		{"released, Delete", ours(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete), true, VolumeDecision{Delete: true}},
		{"released, Retain", ours(corev1.VolumeReleased, corev1.PersistentVolumeReclaimRetain), true, VolumeDecision{}},
		{"bound, node gone", ours(corev1.VolumeBound, corev1.PersistentVolumeReclaimDelete), false, VolumeDecision{NodeGone: true}},
		{"released, node gone", ours(corev1.VolumeReleased, corev1.PersistentVolumeReclaimDelete), false, VolumeDecision{Delete: true, NodeGone: true}},
		{"not ours", foreign, true, VolumeDecision{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecideVolume(tc.pv, tc.nodeExists); got != tc.want {
				t.Fatalf("DecideVolume = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestNodeNames(t *testing.T) {
	mk := func(name, node string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: ProvisionerName, NodeAnnotation: node}}}
	}
	foreign := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-x", Annotations: map[string]string{NodeAnnotation: "a"}}}
	got := NodeNames("a", []*corev1.PersistentVolume{mk("pvc-2", "a"), mk("pvc-1", "a"), mk("pvc-3", "b"), foreign})
	if got != "pvc-1,pvc-2" {
		t.Fatalf("NodeNames = %q", got)
	}
	if m := ParseNames(got); len(m) != 2 || !m["pvc-1"] || !m["pvc-2"] || len(ParseNames("")) != 0 {
		t.Fatalf("ParseNames = %v", m)
	}
}

func TestDecideSweep(t *testing.T) {
	t0 := time.Unix(1000, 0)
	unlisted := map[string]time.Time{}
	listed := map[string]bool{"pvc-keep": true}
	present := []string{"pvc-keep", "pvc-gone"}
	if got := DecideSweep(present, listed, unlisted, t0, SweepGrace); len(got) != 0 {
		t.Fatalf("first sight removed %v", got)
	}
	if got := DecideSweep(present, listed, unlisted, t0.Add(SweepGrace/2), SweepGrace); len(got) != 0 {
		t.Fatalf("within the grace removed %v", got)
	}
	if got := DecideSweep(present, listed, unlisted, t0.Add(SweepGrace), SweepGrace); len(got) != 1 || got[0] != "pvc-gone" {
		t.Fatalf("after the grace removed %v, want [pvc-gone]", got)
	}
	// Listed again (a list being rewritten): the clock starts over.
	listed["pvc-gone"] = true
	DecideSweep(present, listed, unlisted, t0.Add(2*SweepGrace), SweepGrace)
	delete(listed, "pvc-gone")
	if got := DecideSweep(present, listed, unlisted, t0.Add(2*SweepGrace+time.Second), SweepGrace); len(got) != 0 {
		t.Fatalf("relisted then unlisted removed at once: %v", got)
	}
	// A directory that went away is forgotten.
	DecideSweep([]string{"pvc-keep"}, listed, unlisted, t0.Add(3*SweepGrace), SweepGrace)
	if _, ok := unlisted["pvc-gone"]; ok {
		t.Fatal("a directory no longer present is still tracked")
	}
}

// The node's list is the cluster admin's to write: only names that can be a volume's
// directory count.
func TestListedNames(t *testing.T) {
	got := ListedNames("pvc-1,..,.,../../etc,a/b,/abs,pvc-2,UPPER,")
	if len(got) != 2 || !got["pvc-1"] || !got["pvc-2"] {
		t.Fatalf("ListedNames = %v, want pvc-1 and pvc-2", got)
	}
}

func TestEnsureVolumeDir(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/pvc-1"
	ensureVolumeDir(p)
	if fi, err := os.Stat(p); err != nil || !fi.IsDir() || fi.Mode().Perm() != volumeDirMode {
		t.Fatalf("made %v %v", fi, err)
	}
	// One the kubelet made first (0755) is opened.
	q := dir + "/pvc-2"
	if err := os.Mkdir(q, 0o755); err != nil {
		t.Fatal(err)
	}
	ensureVolumeDir(q)
	if fi, _ := os.Stat(q); fi.Mode().Perm() != volumeDirMode {
		t.Fatalf("mode %v", fi.Mode())
	}
	// A link is left alone, and so is what it points at.
	target := t.TempDir()
	if err := os.Chmod(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, dir+"/pvc-3"); err != nil {
		t.Fatal(err)
	}
	ensureVolumeDir(dir + "/pvc-3")
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o700 {
		t.Fatalf("followed a link: %v", fi.Mode())
	}
}

// The node mounts its volumes where the provisioner's volumes point.
func TestNodeDirIsTheNodesVolumesDir(t *testing.T) {
	if node.VolumesDir != NodeDir {
		t.Fatalf("node.VolumesDir %s, volumes.NodeDir %s", node.VolumesDir, NodeDir)
	}
}
