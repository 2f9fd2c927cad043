// Package cluster is the Cluster controller: it runs each running Cluster's control plane
// through a tenant.Manager and reports its phase. Unavailable (stopped, store kept) ->
// Initializing (the child process is starting) -> Ready (/readyz 200 and the default
// namespaces list, with zero nodes) <-> Sleeping (spec.sleepAfter without use: stopped,
// store kept, the gate holding the first request and asking for the wake, sleep.go) ->
// Draining (deleted: the gate answers 503, then the processes stop, then the store is
// removed, then the finalizer goes).
package cluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
	"socialweb.computer/internal/controllers/reconcilekit"
	"socialweb.computer/internal/tenant"
)

// ControllerName names the Cluster controller in logs and metrics.
const ControllerName = "cluster"

// Reasons of the Ready condition.
const (
	ReasonServing     = "Serving"
	ReasonStarting    = "Starting"
	ReasonCrashed     = "Crashed"
	ReasonStopped     = "Stopped"
	ReasonDraining    = "Draining"
	ReasonAsleep      = "Asleep"
	ReasonUnsupported = "NoTenantControlPlanes"
)

// Reconciler reconciles Cluster objects.
type Reconciler struct {
	Client  client.Client
	Tenants *tenant.Manager
	// Unavailable, when Tenants is nil, says why this process cannot run tenant control
	// planes; it is reported on every Cluster.
	Unavailable string
	// NodesRefresh is how often a Ready cluster's node count is re-read. Default 30s.
	NodesRefresh time.Duration

	mu           sync.Mutex
	bootstrapped map[tenant.Key]string    // instance (and revoked identities) that was bootstrapped
	lastBusy     map[tenant.Key]time.Time // when a node, claim or demand for one was last seen (sleep.go)
}

// Setup registers the Cluster controller with m. tenants may be nil (then every Cluster
// reports unavailable, saying why).
func Setup(m ctrl.Manager, obs manager.ReconcileObserver, tenants *tenant.Manager, unavailable string) error {
	r := &Reconciler{Client: m.GetClient(), Tenants: tenants, Unavailable: unavailable}
	b := ctrl.NewControllerManagedBy(m).
		Named(ControllerName).
		For(&v1alpha1.Cluster{}).
		WithOptions(manager.ControllerOptions(4))
	if tenants != nil {
		events := make(chan event.GenericEvent, 1024)
		go func() {
			for k := range tenants.Events() {
				c := &v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
				events <- event.GenericEvent{Object: c}
			}
		}()
		b = b.WatchesRawSource(source.Channel(events, &handler.EnqueueRequestForObject{}))
	}
	return b.Complete(manager.Observed(ControllerName, r, obs))
}

// Access, for the generated ClusterRole (config/rbac/role.yaml): patches Clusters (the
// teardown finalizer, and once their managed fields, reconcilekit.ApplyStatus) and applies
// their status.
// +kubebuilder:rbac:groups=socialweb.computer,resources=clusters,verbs=list;watch;patch
// +kubebuilder:rbac:groups=socialweb.computer,resources=clusters/status,verbs=patch

// Reconcile drives one Cluster.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	key := tenant.Key{Namespace: req.Namespace, Name: req.Name}
	var c v1alpha1.Cluster
	if err := r.Client.Get(ctx, req.NamespacedName, &c); err != nil {
		if apierrors.IsNotFound(err) && r.Tenants != nil && r.Tenants.Status(key).Server != "" {
			// Gone without our finalizer (removed by hand): do not leave its processes behind.
			r.Tenants.Drain(key)
			return reconcile.Result{}, r.Tenants.Remove(key)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !c.DeletionTimestamp.IsZero() {
		return r.teardown(ctx, key, &c)
	}
	if _, err := reconcilekit.EnsureFinalizer(ctx, r.Client, &c, v1alpha1.FinalizerClusterTeardown); err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	stored := c.DeepCopy()
	c.Status.ObservedGeneration = c.Generation
	var result reconcile.Result

	switch {
	case r.Tenants == nil:
		c.Status.Phase, c.Status.Server, c.Status.Instance = v1alpha1.ClusterUnavailable, "", ""
		setReady(&c, metav1.ConditionFalse, ReasonUnsupported, r.Unavailable)

	case !c.Spec.Running:
		if err := r.Tenants.Stop(key); err != nil {
			return reconcile.Result{}, err
		}
		s := r.Tenants.Status(key)
		c.Status.Phase, c.Status.Server, c.Status.Instance = v1alpha1.ClusterUnavailable, s.Server, ""
		setReady(&c, metav1.ConditionFalse, ReasonStopped, "the control plane is stopped (spec.running is false); its store is kept")

	case c.Status.Phase == v1alpha1.ClusterSleeping && sleepAfter(&c) > 0 && !r.Tenants.WakeRequested(key) && !r.Tenants.Running(key):
		// Asleep, and no client came: stay so (a restarted gateway puts the gate back,
		// asleep). A control plane running under a status still Sleeping is a wake whose
		// status is not written yet: it goes on below.
		if err := r.Tenants.Sleep(key, startOptions(&c)); err != nil {
			return reconcile.Result{}, err
		}
		c.Status.Server, c.Status.Instance = r.Tenants.Status(key).Server, ""
		if cond := meta.FindStatusCondition(c.Status.Conditions, string(v1alpha1.ConditionReady)); cond == nil || cond.Reason != ReasonAsleep {
			setAsleep(&c, "asleep before this controller started")
		}

	default:
		// A revoked identity's tokens stop working before anything else runs: its tokens
		// are denied and the signing key rotated, restarting a running control plane
		// (tenant.Manager.ApplyRevocations); then the bootstrap removes what it made.
		start := startOptions(&c)
		if _, err := r.Tenants.ApplyRevocations(key, c.Spec.RevokedDids(), start); err != nil {
			c.Status.Phase = v1alpha1.ClusterInitializing
			setReady(&c, metav1.ConditionFalse, ReasonCrashed, "could not apply the revocations: "+err.Error())
			result.RequeueAfter = 5 * time.Second
			break
		}
		s, err := r.Tenants.Start(key, start)
		if err != nil {
			c.Status.Phase = v1alpha1.ClusterInitializing
			setReady(&c, metav1.ConditionFalse, ReasonCrashed, "could not prepare the control plane: "+err.Error())
			result.RequeueAfter = 5 * time.Second
			break
		}
		c.Status.Server, c.Status.Instance = s.Server, s.Instance
		c.Status.PodSecurity, c.Status.PodUserNamespaces = string(s.Policy.Level), string(s.Policy.UserNamespaces)
		switch s.State {
		case tenant.StateReady:
			if err := r.bootstrap(ctx, key, s.Instance, c.Spec.Account, c.Spec.RevokedDids()); err != nil {
				c.Status.Phase = v1alpha1.ClusterInitializing
				setReady(&c, metav1.ConditionFalse, ReasonStarting, err.Error())
				result.RequeueAfter = time.Second
				break
			}
			n, err := r.Tenants.Nodes(ctx, key)
			if err != nil {
				result.RequeueAfter = time.Second
				break
			}
			// status.nodes is the node host's (internal/controllers/nodehost): the claimed
			// nodes that are Ready. The message counts every registered node.
			c.Status.Phase = v1alpha1.ClusterReady
			msg := fmt.Sprintf("serving with %d nodes", n)
			if s.Restarts > 0 {
				msg += fmt.Sprintf("; restarted %d times, last exit: %s", s.Restarts, s.LastExit)
			}
			setReady(&c, metav1.ConditionTrue, ReasonServing, msg)
			result.RequeueAfter = r.nodesRefresh()
			d, err := r.sleepDecision(ctx, key, &c, s, n)
			if err != nil {
				return reconcile.Result{}, err
			}
			if d.Sleep {
				if err := r.Tenants.Sleep(key, start); err != nil {
					return reconcile.Result{}, err
				}
				setAsleep(&c, d.Why)
				c.Status.Instance = ""
			} else if d.RecheckAfter > 0 {
				result.RequeueAfter = min(result.RequeueAfter, d.RecheckAfter)
			}
		case tenant.StateCrashed:
			c.Status.Phase = v1alpha1.ClusterInitializing
			setReady(&c, metav1.ConditionFalse, ReasonCrashed, fmt.Sprintf("the control plane exited (%d restarts so far, restarting with backoff): %s", s.Restarts, s.LastExit))
		default:
			c.Status.Phase = v1alpha1.ClusterInitializing
			msg := "the control plane is starting"
			if s.Restarts > 0 {
				msg = fmt.Sprintf("the control plane is restarting (%d restarts), last exit: %s", s.Restarts, s.LastExit)
			}
			setReady(&c, metav1.ConditionFalse, ReasonStarting, msg)
		}
	}
	if err := r.writeStatus(ctx, stored, &c); err != nil {
		return reconcilekit.Settle(ctx, err)
	}
	return result, nil
}

func startOptions(c *v1alpha1.Cluster) tenant.StartOptions {
	return tenant.StartOptions{PodSecurity: tenant.PodSecurityLevel(c.Spec.PodSecurity), PodUserNamespaces: tenant.PodUserNamespaces(c.Spec.PodUserNamespaces)}
}

// teardown: Draining is written first, then the gate answers 503 and the process group is
// stopped (Drain), then the store goes (Remove), then the finalizer.
func (r *Reconciler) teardown(ctx context.Context, key tenant.Key, c *v1alpha1.Cluster) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(c, v1alpha1.FinalizerClusterTeardown) {
		return reconcile.Result{}, nil
	}
	if c.Status.Phase != v1alpha1.ClusterDraining {
		stored := c.DeepCopy()
		c.Status.Phase = v1alpha1.ClusterDraining
		c.Status.TeardownBlocked = "stopping the control plane"
		setReady(c, metav1.ConditionFalse, ReasonDraining, "the cluster is being deleted")
		if err := r.writeStatus(ctx, stored, c); err != nil {
			return reconcilekit.Settle(ctx, err)
		}
	}
	if r.Tenants != nil {
		r.Tenants.Drain(key)
		if err := r.Tenants.Remove(key); err != nil {
			stored := c.DeepCopy()
			c.Status.TeardownBlocked = "removing the store: " + err.Error()
			_ = r.writeStatus(ctx, stored, c)
			return reconcile.Result{}, err
		}
		r.mu.Lock()
		delete(r.bootstrapped, key)
		r.mu.Unlock()
	}
	_, err := reconcilekit.RemoveFinalizer(ctx, r.Client, c, v1alpha1.FinalizerClusterTeardown)
	return reconcilekit.Settle(ctx, client.IgnoreNotFound(err))
}

// bootstrap runs tenant.Bootstrap once per instance and set of revoked identities: a
// revocation while the cluster runs is applied again here, so the identity is out of the
// cluster even when the gateway's own removal did not reach it.
func (r *Reconciler) bootstrap(ctx context.Context, key tenant.Key, instance, account string, revoked []string) error {
	sort.Strings(revoked)
	stamp := instance + "\x00" + strings.Join(revoked, "\x00")
	r.mu.Lock()
	done := r.bootstrapped[key] == stamp
	r.mu.Unlock()
	if done {
		return nil
	}
	if err := r.Tenants.Bootstrap(ctx, key, account, revoked); err != nil {
		return err
	}
	instance = stamp
	r.mu.Lock()
	if r.bootstrapped == nil {
		r.bootstrapped = map[tenant.Key]string{}
	}
	r.bootstrapped[key] = instance
	r.mu.Unlock()
	return nil
}

func (r *Reconciler) nodesRefresh() time.Duration {
	if r.NodesRefresh > 0 {
		return r.NodesRefresh
	}
	return 30 * time.Second
}

// FieldManager is the field manager of this controller's applies of a Cluster's status.
const FieldManager = "socialweb.computer/cluster"

// StatusOwner is the part of a Cluster's status this controller owns: the node host
// (internal/controllers/nodehost) owns nodes and the Scaling condition.
var StatusOwner = reconcilekit.StatusOwner{Manager: FieldManager,
	Fields:     []string{"observedGeneration", "phase", "server", "instance", "podSecurity", "podUserNamespaces", "teardownBlocked"},
	Conditions: []string{string(v1alpha1.ConditionReady)}}

// writeStatus writes the fields of the status this controller owns once, by apply
// (reconcilekit.ApplyStatus), so the node host's writes of the same status neither conflict
// with it nor are lost.
func (r *Reconciler) writeStatus(ctx context.Context, stored, c *v1alpha1.Cluster) error {
	_, err := reconcilekit.ApplyStatus(ctx, r.Client, StatusOwner, stored, c)
	return client.IgnoreNotFound(err)
}

func setReady(c *v1alpha1.Cluster, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&c.Status.Conditions, metav1.Condition{
		Type: string(v1alpha1.ConditionReady), Status: status, Reason: reason, Message: msg, ObservedGeneration: c.Generation,
	})
}
