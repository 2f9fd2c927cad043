package manager

import (
	"context"
	"errors"
	"regexp"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// Forbidden is a request the API server's authorizer refused: the process lacks a
// permission it needs, and no retry will grant it. It names what to grant.
type Forbidden struct {
	Verb string
	// Resource is plural and may carry a subresource ("computecontracts/status").
	Resource  string
	Group     string
	Namespace string
	// User is the identity the server saw; empty when its message did not say.
	User string
}

func (f *Forbidden) Error() string {
	var b strings.Builder
	b.WriteString("forbidden: ")
	b.WriteString(f.Verb)
	b.WriteByte(' ')
	b.WriteString(f.Resource)
	if f.Group != "" {
		b.WriteByte('.')
		b.WriteString(f.Group)
	}
	if f.Namespace != "" {
		b.WriteString(" in namespace ")
		b.WriteString(f.Namespace)
	}
	if f.User != "" {
		b.WriteString(" as ")
		b.WriteString(f.User)
	}
	b.WriteString(": grant it (see config/rbac)")
	return b.String()
}

// authzMessage is the message the API server's authorization filter writes
// (k8s.io/apiserver responsewriters.forbiddenMessage), after "<resource> is forbidden: ".
// It is the only part of a 403 that says verb and user; other 403s (admission, quota, a
// terminating namespace) say something else and are not permission problems.
var authzMessage = regexp.MustCompile(`User "([^"]*)" cannot (\S+) resource "([^"]*)" in API group "([^"]*)"(?: in the namespace "([^"]*)")?`)

// AsForbidden returns the permission err reports the process lacks, if it is an
// authorization refusal.
func AsForbidden(err error) (*Forbidden, bool) {
	var f *Forbidden
	if errors.As(err, &f) {
		return f, true
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Reason != metav1.StatusReasonForbidden {
		return nil, false
	}
	m := authzMessage.FindStringSubmatch(status.Status().Message)
	if m == nil {
		return nil, false
	}
	return &Forbidden{User: m[1], Verb: m[2], Resource: m[3], Group: m[4], Namespace: m[5]}, true
}

// readForbidden is AsForbidden for a list or watch an informer made: any 403 there is a
// refusal to read (admission never sees reads), so a server whose message does not follow
// the upstream wording is still reported, from the status details.
func readForbidden(err error) (*Forbidden, bool) {
	if f, ok := AsForbidden(err); ok {
		return f, true
	}
	if !apierrors.IsForbidden(err) {
		return nil, false
	}
	f := &Forbidden{Verb: "list"}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if d := status.Status().Details; d != nil {
			// NewForbidden puts the resource in Details.Kind.
			f.Resource, f.Group = d.Kind, d.Group
		}
	}
	if f.Resource == "" {
		return nil, false
	}
	return f, true
}

// watchErrorHandler is the informers' watch error handler: a refused list or watch is
// reported (the informer would otherwise retry it forever and its cache never sync);
// anything else goes to client-go's default handler, which logs it before the retry.
func watchErrorHandler(report func(error)) toolscache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, r *toolscache.Reflector, err error) {
		if f, ok := readForbidden(err); ok {
			report(f)
			return
		}
		toolscache.DefaultWatchErrorHandler(ctx, r, err)
	}
}

// guardedLock reports a refused read or write of the leader Lease: the elector would
// log it and retry every RetryPeriod, and the replica would never lead nor say why.
type guardedLock struct {
	resourcelock.Interface
	report func(error)
}

func (l guardedLock) check(err error) error { return reportForbidden(err, l.report) }

// reportForbidden reports err when it is an authorization refusal, and returns it.
func reportForbidden(err error, report func(error)) error {
	if f, ok := AsForbidden(err); ok {
		report(f)
	}
	return err
}

func (l guardedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, b, err := l.Interface.Get(ctx)
	return r, b, l.check(err)
}

func (l guardedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.check(l.Interface.Create(ctx, ler))
}

func (l guardedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.check(l.Interface.Update(ctx, ler))
}

// reportingFuncs are the manager's client with every request checked: a permission the
// API server refuses to a reconcile's write (or an uncached read) ends the process as a
// refused watch does, rather than being the reconcile's error, retried with backoff and
// logged each time while the object stays half done. Admission, quota and terminating
// namespaces also answer 403, but not with the authorizer's message, so AsForbidden leaves
// them to the reconcile.
func reportingFuncs(report func(error)) interceptor.Funcs {
	check := func(err error) error { return reportForbidden(err, report) }
	return interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			return check(c.Get(ctx, key, obj, opts...))
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return check(c.List(ctx, list, opts...))
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			return check(c.Create(ctx, obj, opts...))
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			return check(c.Delete(ctx, obj, opts...))
		},
		DeleteAllOf: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteAllOfOption) error {
			return check(c.DeleteAllOf(ctx, obj, opts...))
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			return check(c.Update(ctx, obj, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			return check(c.Patch(ctx, obj, patch, opts...))
		},
		Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
			return check(c.Apply(ctx, obj, opts...))
		},
		SubResourceGet: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceGetOption) error {
			return check(c.SubResource(sub).Get(ctx, obj, subObj, opts...))
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			return check(c.SubResource(sub).Create(ctx, obj, subObj, opts...))
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			return check(c.SubResource(sub).Update(ctx, obj, opts...))
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			return check(c.SubResource(sub).Patch(ctx, obj, patch, opts...))
		},
		SubResourceApply: func(ctx context.Context, c client.Client, sub string, obj runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
			return check(c.SubResource(sub).Apply(ctx, obj, opts...))
		},
	}
}

// reportingClient is client.New (the manager's default) with reportingFuncs.
func reportingClient(report func(error)) client.NewClientFunc {
	return func(cfg *rest.Config, o client.Options) (client.Client, error) {
		c, err := client.NewWithWatch(cfg, o)
		if err != nil {
			return nil, err
		}
		return interceptor.NewClient(c, reportingFuncs(report)), nil
	}
}

// errorsOnce keeps the first fatal error of a manager; later ones are dropped, so a
// permission missing for ten informers is reported once.
type errorsOnce struct{ ch chan error }

func newErrorsOnce() errorsOnce { return errorsOnce{ch: make(chan error, 1)} }

func (e errorsOnce) report(err error) {
	select {
	case e.ch <- err:
	default:
	}
}

// compile-time check that the wrapper is still a lock.
var _ resourcelock.Interface = guardedLock{}
