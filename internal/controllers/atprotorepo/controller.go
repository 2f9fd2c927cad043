package atprotorepo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/repos"
)

// ControllerName names the AtprotoRepo controller in logs and metrics.
const ControllerName = "atprotorepo"

// unavailableRetry is how long to wait before looking again at a repo that cannot be
// reached and whose error says nothing about when to retry.
const unavailableRetry = 10 * time.Second

// Reconciler reconciles AtprotoRepo objects.
type Reconciler struct {
	Client   client.Client
	Resolver *repos.Resolver
	Log      *slog.Logger
}

// Setup registers the AtprotoRepo controller with m.
func Setup(m ctrl.Manager, res *repos.Resolver, log *slog.Logger, obs manager.ReconcileObserver) error {
	if log == nil {
		log = slog.Default()
	}
	r := &Reconciler{Client: m.GetClient(), Resolver: res, Log: log.With("controller", ControllerName)}
	return ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.AtprotoRepo{}).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.reposOfSecret)).
		WithOptions(manager.ControllerOptions(4)).
		Complete(manager.Observed(ControllerName, r, obs))
}

// reposOfSecret maps a Secret to the remote AtprotoRepos whose credentials it holds.
func (r *Reconciler) reposOfSecret(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.AtprotoRepoList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, rp := range list.Items {
		if rp.Spec.Remote != nil && rp.Spec.Remote.CredentialsRef.Name == o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: rp.Namespace, Name: rp.Name}})
		}
	}
	return out
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): reads repos and their
// credentials Secrets, writes the repos' status.
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos,verbs=list;watch
// +kubebuilder:rbac:groups=socialweb.computer,resources=atprotorepos/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;list;watch

// Reconcile resolves one AtprotoRepo and writes its status.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var obj v1alpha1.AtprotoRepo
	if err := r.Client.Get(ctx, req.NamespacedName, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.Resolver.Release(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if obj.DeletionTimestamp != nil {
		r.Resolver.Release(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	stored := obj.DeepCopy()
	obj.Status.ObservedGeneration = obj.Generation
	repo, err := r.Resolver.Connect(ctx, &obj)
	cond, retry := readiness(obj.Generation, repo, err)
	if repo != nil {
		obj.Status.DID, obj.Status.Handle, obj.Status.Endpoint = repo.DID(), repo.Handle(), repo.Endpoint()
	}
	meta.SetStatusCondition(&obj.Status.Conditions, cond)
	if cond.Status != metav1.ConditionTrue {
		r.Log.Info("atprotorepo_not_ready", "repo", req.String(), "reason", cond.Reason, "retryIn", retry, "err", err)
	}
	res, err := reconcilekit.CommitStatus(ctx, r.Client, stored, &obj)
	if err != nil {
		return res, fmt.Errorf("writing status of %s: %w", req, err)
	}
	if res.RequeueAfter > 0 {
		return res, nil
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

// readiness is the Ready condition for the outcome of a Connect, and when to look again.
func readiness(gen int64, repo repos.Repo, err error) (metav1.Condition, time.Duration) {
	c := metav1.Condition{Type: string(v1alpha1.ConditionReady), ObservedGeneration: gen}
	switch {
	case err == nil && repo != nil:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, string(v1alpha1.ReasonLoggedIn), "session open for "+repo.DID()
		return c, 0
	case errors.Is(err, repos.ErrNoEmbeddedPDS):
		// No retry: the process will not grow a PDS; a changed spec reconciles again.
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(v1alpha1.ReasonLocalRepoUnavailable), err.Error()
		return c, 0
	case errors.Is(err, repos.ErrLoginFailed):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, string(v1alpha1.ReasonLoginFailed), err.Error()
	default:
		c.Status, c.Reason = metav1.ConditionFalse, string(v1alpha1.ReasonUnreachable)
		if err != nil {
			c.Message = err.Error()
		}
	}
	retry := repos.RetryAfter(err)
	if retry == 0 {
		retry = unavailableRetry
	}
	return c, retry
}
