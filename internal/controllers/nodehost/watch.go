package nodehost

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/scale"
	"socialweb.computer/internal/tenant"
)

// Tenants reaches a tenant cluster's apiserver as its admin (tenant.Manager is one).
type Tenants interface {
	AdminConfig(k tenant.Key) (*rest.Config, error)
}

// tenantWatch is the informers of one tenant cluster instance, and what the node host
// remembers of that cluster between decisions.
type tenantWatch struct {
	instance string
	cancel   context.CancelFunc
	client   kubernetes.Interface
	// events records Events in the tenant cluster, on its pods.
	events record.EventRecorder
	// reported is, per pod (namespace/name), the reason last given in an Event that no node
	// can run it: a decision on every change says it again only when it changed.
	reported map[string]string
	// blocked is, per pod (namespace/name), the reason last given in an Event that its
	// eviction for a consolidation was refused.
	blocked map[string]string
	pods    listersv1.PodLister
	nodes   listersv1.NodeLister
	// claims and volumes are the tenant's PersistentVolumeClaims and PersistentVolumes:
	// a pod bound to a local volume runs only on its node (volumes.go).
	claims  listersv1.PersistentVolumeClaimLister
	volumes listersv1.PersistentVolumeLister
	synced  []cache.InformerSynced
	// state is what the last decision returned (when each node was first seen empty).
	state scale.State
	// pendingSeen is when each unschedulable pod (namespace/name) was first seen so
	// (RefinePendingSince).
	pendingSeen map[string]time.Time
}

func (w *tenantWatch) hasSynced() bool {
	for _, s := range w.synced {
		if !s() {
			return false
		}
	}
	return true
}

func (w *tenantWatch) lists() ([]*corev1.Pod, []*corev1.Node, error) {
	pods, err := w.pods.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	nodes, err := w.nodes.List(labels.Everything())
	if err != nil {
		return nil, nil, err
	}
	return pods, nodes, nil
}

// watches holds the tenant watches, one per Cluster, and wakes the Cluster on every change
// of its tenant's pods and nodes.
type watches struct {
	tenants Tenants
	// queue is the controller's work queue, set when the controller starts (source).
	queue workqueue.TypedRateLimitingInterface[reconcile.Request]

	mu sync.Mutex
	by map[tenant.Key]*tenantWatch
	// closed: the controller stopped; no watch starts again.
	closed bool
}

// ensure returns the watch of the Cluster's current instance, starting it (and stopping a
// previous instance's) when needed. The emptiness memory survives a new instance of the
// control plane: the nodes are the same.
func (ws *watches) ensure(c *v1alpha1.Cluster) (*tenantWatch, error) {
	k := tenant.Key{Namespace: c.Namespace, Name: c.Name}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w := ws.by[k]; w != nil && w.instance == c.Status.Instance {
		return w, nil
	}
	if ws.closed {
		return nil, ErrStopped
	}
	cfg, err := ws.tenants.AdminConfig(k)
	if err != nil {
		return nil, fmt.Errorf("reaching tenant cluster %s: %w", k, err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 0 // watches are long requests; each call has its own context
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client for tenant cluster %s: %w", k, err)
	}
	var state scale.State
	if old := ws.by[k]; old != nil {
		old.cancel()
		state = old.state
	}
	ctx, stop := context.WithCancel(context.Background())
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	cancel := func() { stop(); events.Shutdown() }
	f := informers.NewSharedInformerFactory(cs, 0)
	pods, nodes := f.Core().V1().Pods(), f.Core().V1().Nodes()
	pvcs, pvs := f.Core().V1().PersistentVolumeClaims(), f.Core().V1().PersistentVolumes()
	wake := func(any) { ws.wake(k) }
	// An update wakes the Cluster only when it changes what the decision reads: a busy
	// tenant's pods change status often, and each decision lists the claims.
	handlers := map[cache.SharedIndexInformer]cache.ResourceEventHandler{
		pods.Informer(): cache.ResourceEventHandlerFuncs{AddFunc: wake, DeleteFunc: wake, UpdateFunc: func(o, n any) {
			op, ok1 := o.(*corev1.Pod)
			np, ok2 := n.(*corev1.Pod)
			if !ok1 || !ok2 || PodOf(op) != PodOf(np) {
				ws.wake(k)
			}
		}},
		nodes.Informer(): cache.ResourceEventHandlerFuncs{AddFunc: wake, DeleteFunc: wake, UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || NodeJoined(on) != NodeJoined(nn) || on.Spec.Unschedulable != nn.Spec.Unschedulable {
				ws.wake(k)
			}
		}},
		// A claim's binding is what the decision reads of it; a volume, its node affinity
		// (set at creation).
		pvcs.Informer(): cache.ResourceEventHandlerFuncs{UpdateFunc: func(o, n any) {
			oc, ok1 := o.(*corev1.PersistentVolumeClaim)
			nc, ok2 := n.(*corev1.PersistentVolumeClaim)
			if !ok1 || !ok2 || oc.Spec.VolumeName != nc.Spec.VolumeName {
				ws.wake(k)
			}
		}},
		pvs.Informer(): cache.ResourceEventHandlerFuncs{AddFunc: wake, DeleteFunc: wake},
	}
	for inf, h := range handlers {
		if _, err := inf.AddEventHandler(h); err != nil {
			cancel()
			return nil, err
		}
		// Only what the decision reads is kept: managed fields are dropped.
		_ = inf.SetTransform(func(o any) (any, error) {
			if m, ok := o.(metav1.Object); ok {
				m.SetManagedFields(nil)
			}
			return o, nil
		})
	}
	w := &tenantWatch{instance: c.Status.Instance, cancel: cancel, client: cs,
		events:   events.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: EventComponent}),
		reported: map[string]string{},
		pods:     pods.Lister(), nodes: nodes.Lister(), claims: pvcs.Lister(), volumes: pvs.Lister(), state: state,
		synced: []cache.InformerSynced{pods.Informer().HasSynced, nodes.Informer().HasSynced,
			pvcs.Informer().HasSynced, pvs.Informer().HasSynced}}
	f.Start(ctx.Done())
	if ws.by == nil {
		ws.by = map[tenant.Key]*tenantWatch{}
	}
	ws.by[k] = w
	return w, nil
}

// stop ends the watch of a Cluster and drops its emptiness memory (the cluster stopped or
// went, so its nodes are released anyway).
func (ws *watches) stop(k tenant.Key) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w := ws.by[k]; w != nil {
		w.cancel()
		delete(ws.by, k)
	}
}

func (ws *watches) stateOf(w *tenantWatch) scale.State {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return w.state
}

// refinePending sets the pods' PendingSince from when w first saw each unschedulable
// (RefinePendingSince) and remembers the sights for the next decision.
func (ws *watches) refinePending(w *tenantWatch, now time.Time, pods []scale.Pod) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.pendingSeen = RefinePendingSince(now, pods, w.pendingSeen)
}

func (ws *watches) setState(w *tenantWatch, st scale.State) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w.state = st
}

// source hands the controller's queue to the watches: a tenant change adds the Cluster to
// the queue directly, so no wake-up is ever dropped and repeated ones coalesce.
// When the controller stops, every tenant watch stops with it: an open watch would hold a
// tenant apiserver's graceful shutdown until its timeout.
func (ws *watches) source(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
	ws.mu.Lock()
	ws.queue = q
	ws.mu.Unlock()
	go func() {
		<-ctx.Done()
		ws.mu.Lock()
		defer ws.mu.Unlock()
		for k, w := range ws.by {
			w.cancel()
			delete(ws.by, k)
		}
		ws.queue, ws.closed = nil, true
	}()
	return nil
}

func (ws *watches) wake(k tenant.Key) {
	ws.mu.Lock()
	q := ws.queue
	ws.mu.Unlock()
	if q != nil {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: k.Namespace, Name: k.Name}})
	}
}
