package volumes

import (
	"context"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// SweepGrace is how long a directory of NodeDir must stay unlisted, seen so on two sweeps at
// least that far apart, before the node removes it: a list the provisioner is rewriting
// does not cost a volume its data.
const SweepGrace = 30 * time.Second

// DecideSweep returns the directories of present (names in NodeDir) that listed (the node's
// NamesAnnotation) no longer names and that were first seen unlisted at least grace before
// now; unlisted is updated: when each present, unlisted name was first seen so.
func DecideSweep(present []string, listed map[string]bool, unlisted map[string]time.Time, now time.Time, grace time.Duration) []string {
	var remove []string
	seen := map[string]bool{}
	for _, name := range present {
		seen[name] = true
		if listed[name] {
			delete(unlisted, name)
			continue
		}
		first, ok := unlisted[name]
		if !ok {
			unlisted[name] = now
			continue
		}
		if now.Sub(first) >= grace {
			remove = append(remove, name)
		}
	}
	for name := range unlisted {
		if !seen[name] {
			delete(unlisted, name)
		}
	}
	return remove
}

// ListedNames are the names of list (NamesAnnotation) that can be a directory of NodeDir:
// the annotation is the cluster admin's to write, so anything else in it is ignored.
func ListedNames(list string) map[string]bool {
	out := map[string]bool{}
	for name := range ParseNames(list) {
		if len(validation.IsDNS1123Subdomain(name)) == 0 {
			out[name] = true
		}
	}
	return out
}

// volumeDirMode is a volume directory's mode: any user of the pods may write (a hostPath
// volume gets no fsGroup; the kubelet would make it 0755, root's alone).
const volumeDirMode = 0o777

// RunSweeper keeps dir (NodeDir, in the node) in step with the node's list (NamesAnnotation
// on Node node, read with client: a node may read its own Node), every period until ctx
// ends: each listed volume's directory exists, mode 0777; a directory the list has stopped
// naming, the data of a deleted volume, is removed (DecideSweep). It runs in the node (the
// kubelet's process) and touches only direct children of dir. A list it cannot read
// changes nothing.
func RunSweeper(ctx context.Context, client func() (kubernetes.Interface, error), node, dir string, period time.Duration) {
	unlisted := map[string]time.Time{}
	// Each failure is logged when it differs from the last: a node that cannot read its
	// Node for a while would otherwise log every period.
	lastErr := ""
	fail := func(what string, err error) {
		if msg := what + ": " + err.Error(); msg != lastErr {
			lastErr = msg
			klog.InfoS("volume sweep: "+what, "node", node, "err", err)
		}
	}
	var listed map[string]bool // nil until the list is read
	apply := func() {
		if listed == nil {
			return
		}
		for name := range listed {
			ensureVolumeDir(filepath.Join(dir, name))
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		var present []string
		for _, e := range ents {
			present = append(present, e.Name())
		}
		for _, name := range DecideSweep(present, listed, unlisted, time.Now(), SweepGrace) {
			// filepath.Join of a name read from the directory: one level, never "..".
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				klog.ErrorS(err, "volume sweep: removing a deleted volume's directory", "volume", name)
				continue
			}
			delete(unlisted, name)
			klog.InfoS("volume sweep: removed a deleted volume's directory", "volume", name)
		}
	}
	t := time.NewTicker(period)
	defer t.Stop()
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	// The Node is watched, so a new volume's directory is made (and opened to the pods'
	// users) as soon as it is listed, before the volume exists and well before a pod mounts
	// it; the ticker applies the list again, for the removals' grace.
	for ctx.Err() == nil {
		c, err := client()
		if err != nil {
			fail("no client", err)
			wait()
			continue
		}
		w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", node).String()})
		if err != nil {
			fail("watching the node", err)
			wait()
			continue
		}
		lastErr = ""
	events:
		for {
			select {
			case <-ctx.Done():
				w.Stop()
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					break events
				}
				if ev.Type == watch.Error {
					fail("watching the node", apierrors.FromObject(ev.Object))
					w.Stop()
					if !wait() {
						return
					}
					break events
				}
				if n, isNode := ev.Object.(*corev1.Node); isNode && ev.Type != watch.Deleted {
					listed = ListedNames(n.Annotations[NamesAnnotation])
					apply()
				}
			case <-t.C:
				apply()
			}
		}
		w.Stop()
	}
}

// ensureVolumeDir makes p a directory of mode volumeDirMode; a symbolic link or a file there
// is left alone.
func ensureVolumeDir(p string) {
	fi, err := os.Lstat(p)
	if os.IsNotExist(err) {
		if err := os.Mkdir(p, volumeDirMode); err != nil && !os.IsExist(err) {
			klog.ErrorS(err, "volume sweep: making a volume's directory", "path", p)
			return
		}
		fi, err = os.Lstat(p)
	}
	if err != nil || !fi.IsDir() || fi.Mode().Perm() == volumeDirMode {
		return
	}
	// Mkdir's mode passes the umask; a directory the kubelet made first is 0755.
	if err := os.Chmod(p, volumeDirMode); err != nil {
		klog.ErrorS(err, "volume sweep: opening a volume's directory to the pods' users", "path", p)
	}
}
