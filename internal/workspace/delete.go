package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// Options of Delete.
type Options struct {
	// Progress receives one line per change of the step's progress (nil: discarded).
	Progress io.Writer
	// Poll is how often what is left is listed again (0: 250 ms).
	Poll time.Duration
	// Root deletes the workspace as a gateway root (NextRoot): every Cluster and NodeClaim
	// of every workspace first.
	Root bool
}

// TimeoutError is a deletion that did not finish in time: the step it was in and the objects
// still there.
type TimeoutError struct {
	Namespace string
	Step      string
	Left      []string // Kind/name, with "(deleting, finalizers ...)" when it waits on one
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("workspace %s: not deleted in time, still in step %s with %d object(s) left: %s "+
		"(a finalizer waits on a controller: is `socialweb up` or `socialweb controllers` running?)",
		e.Namespace, e.Step, len(e.Left), strings.Join(e.Left, ", "))
}

// ErrNoNamespace is an empty workspace name.
var ErrNoNamespace = errors.New("workspace name is empty")

// NameError is a workspace name that cannot name a namespace.
type NameError struct {
	Name    string
	Reasons []string
}

func (e *NameError) Error() string {
	return fmt.Sprintf("workspace name %q is not a namespace name: %s", e.Name, strings.Join(e.Reasons, "; "))
}

// CheckName says whether ns can name a workspace (a DNS-1123 label).
func CheckName(ns string) error {
	if ns == "" {
		return ErrNoNamespace
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return &NameError{Name: ns, Reasons: errs}
	}
	return nil
}

// Kinds are the kinds of the socialweb.computer group that scheme knows and Secret (the
// workspace's credentials, core/v1), sorted.
func Kinds(scheme *runtime.Scheme) []string {
	out := []string{KindSecret}
	for gvk := range scheme.AllKnownTypes() {
		if gvk.GroupVersion() == v1alpha1.GroupVersion && !strings.HasSuffix(gvk.Kind, "List") &&
			scheme.Recognizes(gvk.GroupVersion().WithKind(gvk.Kind+"List")) {
			out = append(out, gvk.Kind)
		}
	}
	sort.Strings(out)
	return out
}

type object struct {
	kind string
	meta metav1.PartialObjectMetadata
}

// GroupVersionKind is the group, version and kind of one of Kinds.
func GroupVersionKind(kind string) schema.GroupVersionKind {
	if kind == KindSecret {
		return corev1.SchemeGroupVersion.WithKind(kind)
	}
	return v1alpha1.GroupVersion.WithKind(kind)
}

// Delete deletes every object of the socialweb.computer group and every Secret in namespace ns in the order of
// Next, until none is left or ctx ends (then a *TimeoutError names what is left).
func Delete(ctx context.Context, c client.Client, scheme *runtime.Scheme, ns string, o Options) error {
	if err := CheckName(ns); err != nil {
		return err
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Poll == 0 {
		o.Poll = 250 * time.Millisecond
	}
	kinds := Kinds(scheme)
	lastLine, step := "", ""
	var left []object
	for {
		var err error
		var everywhere []object // a root's deletion: the Clusters and NodeClaims of every workspace
		if o.Root {
			everywhere, err = list(ctx, c, "", rootKinds)
		}
		left = everywhere
		if err == nil && len(everywhere) == 0 {
			left, err = list(ctx, c, ns, kinds)
		}
		if err != nil {
			if ctx.Err() != nil {
				return timeout(ns, step, left)
			}
			return err
		}
		counts := map[string]Count{}
		for _, obj := range left {
			cnt := counts[obj.kind]
			cnt.Total++
			if obj.meta.DeletionTimestamp != nil {
				cnt.Deleting++
			}
			counts[obj.kind] = cnt
		}
		p := Next(counts)
		if len(everywhere) > 0 {
			p = NextRoot(counts, nil)
		}
		step = p.Step
		if p.Step == StepDone {
			return nil
		}
		for _, obj := range left {
			if obj.meta.DeletionTimestamp != nil || !contains(p.Delete, obj.kind) {
				continue
			}
			m := obj.meta.DeepCopy()
			if err := c.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
				if ctx.Err() != nil {
					return timeout(ns, step, left)
				}
				return fmt.Errorf("workspace %s: delete %s %s/%s: %w", ns, obj.kind, obj.meta.Namespace, obj.meta.Name, err)
			}
		}
		if line := p.Step + ": " + p.Progress; line != lastLine {
			fmt.Fprintln(o.Progress, p.Progress)
			lastLine = line
		}
		select {
		case <-ctx.Done():
			return timeout(ns, step, left)
		case <-time.After(o.Poll):
		}
	}
}

func timeout(ns, step string, left []object) error {
	e := &TimeoutError{Namespace: ns, Step: step}
	for _, obj := range left {
		s := obj.kind + "/" + obj.meta.Name
		if obj.meta.Namespace != ns {
			s = obj.kind + "/" + obj.meta.Namespace + "/" + obj.meta.Name
		}
		if obj.meta.DeletionTimestamp != nil {
			s += fmt.Sprintf(" (deleting, finalizers %v)", obj.meta.Finalizers)
		}
		e.Left = append(e.Left, s)
	}
	return e
}

func list(ctx context.Context, c client.Client, ns string, kinds []string) ([]object, error) {
	var out []object
	for _, k := range kinds {
		l := &metav1.PartialObjectMetadataList{}
		gvk := GroupVersionKind(k)
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(k + "List"))
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
				continue // a kind this API server does not serve has nothing to delete
			}
			return nil, fmt.Errorf("workspace %s: list %s: %w", ns, k, err)
		}
		for _, it := range l.Items {
			it.SetGroupVersionKind(gvk)
			out = append(out, object{kind: k, meta: it})
		}
	}
	return out, nil
}
