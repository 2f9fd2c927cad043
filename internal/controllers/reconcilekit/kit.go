package reconcilekit

import (
	"context"
	"errors"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Soon is how long a reconcile waits before reading again after a conflict or another
// "someone moved the object on" answer: long enough not to spin, short enough to be unseen.
const Soon = 200 * time.Millisecond

// RequeueSoon is the result of a reconcile that has to read again.
func RequeueSoon() reconcile.Result { return reconcile.Result{RequeueAfter: Soon} }

// Merge returns the result that runs soonest: the smallest nonzero RequeueAfter of rs, or
// no requeue when none asks for one.
func Merge(rs ...reconcile.Result) reconcile.Result {
	var out reconcile.Result
	for _, r := range rs {
		if r.RequeueAfter > 0 && (out.RequeueAfter == 0 || r.RequeueAfter < out.RequeueAfter) {
			out.RequeueAfter = r.RequeueAfter
		}
	}
	return out
}

// Step is what one sub-step of a reconcile returned.
type Step struct {
	Result reconcile.Result
	Err    error
}

// Join combines sub-steps: their results merged (Merge), their errors joined.
func Join(steps ...Step) (reconcile.Result, error) {
	rs := make([]reconcile.Result, 0, len(steps))
	var errs []error
	for _, s := range steps {
		rs = append(rs, s.Result)
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
	}
	return Merge(rs...), errors.Join(errs...)
}

// Settle turns a write's error into what Reconcile returns: a conflict is a quiet
// RequeueSoon (logged at V(1)), anything else is the error as it is (nil included).
func Settle(ctx context.Context, err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		log.FromContext(ctx).V(1).Info("conflict: reading again", "after", Soon, "err", err.Error())
		return RequeueSoon(), nil
	}
	return reconcile.Result{}, err
}

// EnsureFinalizer puts finalizer on obj when it is missing, patching with obj's
// resourceVersion as the lock; changed says whether it wrote. On success obj is the
// object the API server returned. A conflict comes back as the error (see Settle).
func EnsureFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) (changed bool, err error) {
	if controllerutil.ContainsFinalizer(obj, finalizer) {
		return false, nil
	}
	return patchFinalizers(ctx, c, obj, func() { controllerutil.AddFinalizer(obj, finalizer) })
}

// RemoveFinalizer takes finalizer off obj when it is there, like EnsureFinalizer.
func RemoveFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) (changed bool, err error) {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return false, nil
	}
	return patchFinalizers(ctx, c, obj, func() { controllerutil.RemoveFinalizer(obj, finalizer) })
}

func patchFinalizers(ctx context.Context, c client.Client, obj client.Object, change func()) (bool, error) {
	patch := client.MergeFromWithOptions(obj.DeepCopyObject().(client.Object), client.MergeFromWithOptimisticLock{})
	change()
	if err := c.Patch(ctx, obj, patch); err != nil {
		return false, err
	}
	return true, nil
}

// StatusChanged reports whether obj's status differs from stored's (equality.Semantic).
// Both are pointers to the same struct type with a Status field; for anything else the
// whole objects are compared.
func StatusChanged(stored, obj client.Object) bool {
	a, aok := statusOf(stored)
	b, bok := statusOf(obj)
	if !aok || !bok {
		return !equality.Semantic.DeepEqual(stored, obj)
	}
	return !equality.Semantic.DeepEqual(a, b)
}

func statusOf(obj client.Object) (any, bool) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil, false
	}
	f := v.Elem().FieldByName("Status")
	if !f.IsValid() {
		return nil, false
	}
	return f.Interface(), true
}

// CommitStatus writes obj's status once, when it differs from stored's: a merge patch of
// the status subresource from stored, locked on obj's resourceVersion (the version this
// reconcile last read or wrote, so a finalizer patch in between does not make it stale).
// A conflict is a quiet RequeueSoon with a nil error; any other error is returned as it is
// (a NotFound too: the caller says whether a vanished object matters). On a write obj is
// the object the API server returned.
func CommitStatus(ctx context.Context, c client.Client, stored, obj client.Object) (reconcile.Result, error) {
	_, err := WriteStatus(ctx, c, stored, obj)
	return Settle(ctx, err)
}

// WriteStatus is CommitStatus for a reconcile whose steps return errors and settle them
// once at the end: the conflict comes back as the error (see Settle). written says whether
// it patched.
func WriteStatus(ctx context.Context, c client.Client, stored, obj client.Object) (written bool, err error) {
	if !StatusChanged(stored, obj) {
		return false, nil
	}
	if err := patchStatus(ctx, c, stored, obj); err != nil {
		return false, err
	}
	return true, nil
}

func patchStatus(ctx context.Context, c client.Client, stored, obj client.Object) error {
	base := stored.DeepCopyObject().(client.Object)
	base.SetResourceVersion(obj.GetResourceVersion())
	return c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}
