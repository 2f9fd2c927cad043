package volumes

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Event reasons the provisioner records.
const (
	ReasonProvisioned        = "Provisioned"
	ReasonProvisioningFailed = "ProvisioningFailed"
	ReasonNodeGone           = "VolumeNodeGone"
)

// Provisioner makes and deletes the local-path volumes of one tenant cluster. It reads the
// cluster through informers, calls DecideClaim and DecideVolume, and applies: it never runs
// anything on a node (the node makes the directory when a pod mounts it, and removes it once
// NamesAnnotation no longer lists it).
type Provisioner struct {
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	mu       sync.Mutex
	goneSeen map[types.UID]bool // volumes whose node-gone event was recorded by this process
	// pending are volumes listed on their node before they exist: kept in the list while
	// the informer has not seen them yet.
	pending map[string]pendingVolume
}

type pendingVolume struct {
	node  string
	since time.Time
}

// pendingFor is how long a volume listed before its creation stays listed unseen.
const pendingFor = time.Minute

// NewProvisioner is a provisioner acting through client.
func NewProvisioner(client kubernetes.Interface) *Provisioner {
	p := &Provisioner{
		client:   client,
		factory:  informers.NewSharedInformerFactory(client, 10*time.Minute),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		goneSeen: map[types.UID]bool{},
		pending:  map[string]pendingVolume{},
	}
	return p
}

// Keys of the work queue: one kind of object each.
const (
	keyClaim  = "claim/"
	keyVolume = "volume/"
	keyNode   = "node/"
)

// Run serves until ctx ends.
func (p *Provisioner) Run(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	p.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "local-path-provisioner"})

	claims := p.factory.Core().V1().PersistentVolumeClaims().Informer()
	pvs := p.factory.Core().V1().PersistentVolumes().Informer()
	nodes := p.factory.Core().V1().Nodes().Informer()
	_ = p.factory.Storage().V1().StorageClasses().Informer()
	enqueue := func(prefix string) cache.ResourceEventHandler {
		add := func(obj any) {
			if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				p.queue.Add(prefix + k)
			}
		}
		return cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, o any) { add(o) }, DeleteFunc: add}
	}
	if _, err := claims.AddEventHandler(enqueue(keyClaim)); err != nil {
		return err
	}
	if _, err := pvs.AddEventHandler(enqueue(keyVolume)); err != nil {
		return err
	}
	// A volume's node list changes with the volume; the node's own key also comes when
	// the node (re)appears, so its list is written then.
	if _, err := pvs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.enqueueNodeOf(o) },
		UpdateFunc: func(_, o any) { p.enqueueNodeOf(o) },
		DeleteFunc: func(o any) { p.enqueueNodeOf(o) },
	}); err != nil {
		return err
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { p.enqueueNode(o) },
		UpdateFunc: func(_, o any) { p.enqueueNode(o) },
		// A node gone: each of its volumes records that its data went with it.
		DeleteFunc: func(o any) { p.enqueueVolumesOf(o) },
	}); err != nil {
		return err
	}
	p.factory.Start(ctx.Done())
	defer p.factory.Shutdown()
	for typ, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("local-path provisioner: %v informer did not sync", typ)
		}
	}
	go func() { <-ctx.Done(); p.queue.ShutDown() }()
	for p.next(ctx) {
	}
	return ctx.Err()
}

func (p *Provisioner) enqueueNode(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		p.queue.Add(keyNode + n.Name)
	}
}

func (p *Provisioner) enqueueNodeOf(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pv, ok := obj.(*corev1.PersistentVolume); ok && Ours(pv) {
		// Seen: from now on the node's list follows the informer.
		p.mu.Lock()
		delete(p.pending, pv.Name)
		p.mu.Unlock()
		p.queue.Add(keyNode + pv.Annotations[NodeAnnotation])
	}
}

func (p *Provisioner) enqueueVolumesOf(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	pvs, _ := p.factory.Core().V1().PersistentVolumes().Lister().List(labels.Everything())
	for _, pv := range pvs {
		if Ours(pv) && pv.Annotations[NodeAnnotation] == n.Name {
			p.queue.Add(keyVolume + pv.Name)
		}
	}
}

func (p *Provisioner) next(ctx context.Context) bool {
	key, quit := p.queue.Get()
	if quit {
		return false
	}
	defer p.queue.Done(key)
	if err := p.sync(ctx, key); err != nil {
		klog.ErrorS(err, "local-path provisioner", "key", key)
		p.queue.AddRateLimited(key)
		return true
	}
	p.queue.Forget(key)
	return true
}

func (p *Provisioner) sync(ctx context.Context, key string) error {
	switch {
	case len(key) > len(keyClaim) && key[:len(keyClaim)] == keyClaim:
		return p.syncClaim(ctx, key[len(keyClaim):])
	case len(key) > len(keyVolume) && key[:len(keyVolume)] == keyVolume:
		return p.syncVolume(ctx, key[len(keyVolume):])
	case len(key) > len(keyNode) && key[:len(keyNode)] == keyNode:
		return p.syncNode(ctx, key[len(keyNode):])
	}
	return nil
}

func (p *Provisioner) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	claim, err := p.factory.Core().V1().PersistentVolumeClaims().Lister().PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	className := ""
	if claim.Spec.StorageClassName != nil {
		className = *claim.Spec.StorageClassName
	}
	class, err := p.factory.Storage().V1().StorageClasses().Lister().Get(className)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	_, err = p.factory.Core().V1().PersistentVolumes().Lister().Get(VolumeName(claim))
	exists := err == nil
	d := DecideClaim(claim, class, exists)
	switch {
	case d.Refuse != "":
		p.recorder.Event(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, d.Refuse)
		return nil
	case d.Provision == "":
		return nil
	}
	node, err := p.factory.Core().V1().Nodes().Lister().Get(d.Provision)
	if apierrors.IsNotFound(err) {
		p.recorder.Eventf(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, "node %s, chosen by the scheduler, is gone; the scheduler will choose again", d.Provision)
		return nil
	}
	if err != nil {
		return err
	}
	hostname := node.Labels[hostnameLabel]
	if hostname == "" {
		return fmt.Errorf("node %s has no %s label yet", node.Name, hostnameLabel)
	}
	pv := NewVolume(claim, class, node.Name, hostname)
	// The node's list first: the node never removes a directory the list names, so the
	// volume's directory is listed before any pod can make it.
	if err := p.listOnNode(ctx, node.Name, pv.Name); err != nil {
		return err
	}
	_, err = p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		p.recorder.Eventf(claim, corev1.EventTypeWarning, ReasonProvisioningFailed, "creating volume %s: %v", pv.Name, err)
		return err
	}
	p.recorder.Eventf(claim, corev1.EventTypeNormal, ReasonProvisioned, "volume %s on node %s (%s)", pv.Name, node.Name, pv.Spec.HostPath.Path)
	return nil
}

func (p *Provisioner) syncVolume(ctx context.Context, name string) error {
	pv, err := p.factory.Core().V1().PersistentVolumes().Lister().Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	node := pv.Annotations[NodeAnnotation]
	_, err = p.factory.Core().V1().Nodes().Lister().Get(node)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	d := DecideVolume(pv, err == nil)
	if d.NodeGone {
		p.mu.Lock()
		first := !p.goneSeen[pv.UID]
		p.goneSeen[pv.UID] = true
		p.mu.Unlock()
		if first {
			msg := fmt.Sprintf("node %s, which held this volume's data, is gone (released): the data is gone with it; delete the claim to start over", node)
			p.recorder.Event(pv, corev1.EventTypeWarning, ReasonNodeGone, msg)
			if ref := pv.Spec.ClaimRef; ref != nil {
				claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: ref.UID}}
				p.recorder.Event(claim, corev1.EventTypeWarning, ReasonNodeGone, fmt.Sprintf("volume %s: %s", pv.Name, msg))
			}
		}
	}
	if !d.Delete {
		return nil
	}
	// The directory goes when the node sees the volume left its list (syncNode).
	err = p.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pv.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// syncNode writes the node's list of volumes (NamesAnnotation) from the volumes that exist.
func (p *Provisioner) syncNode(ctx context.Context, name string) error {
	node, err := p.factory.Core().V1().Nodes().Lister().Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	pvs, err := p.factory.Core().V1().PersistentVolumes().Lister().List(labels.Everything())
	if err != nil {
		return err
	}
	p.mu.Lock()
	for pv, pd := range p.pending {
		if time.Since(pd.since) > pendingFor {
			delete(p.pending, pv)
		} else if pd.node == name {
			pvs = append(pvs, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv, Annotations: map[string]string{annProvisionedBy: ProvisionerName, NodeAnnotation: name}}})
		}
	}
	p.mu.Unlock()
	want := NodeNames(name, dedupe(pvs))
	if node.Annotations[NamesAnnotation] == want {
		return nil
	}
	return p.annotate(ctx, name, want)
}

// listOnNode adds pv to the node's list before the volume exists.
func (p *Provisioner) listOnNode(ctx context.Context, node, pv string) error {
	n, err := p.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.pending[pv] = pendingVolume{node: node, since: time.Now()}
	p.mu.Unlock()
	names := ParseNames(n.Annotations[NamesAnnotation])
	if names[pv] {
		return nil
	}
	names[pv] = true
	var list []*corev1.PersistentVolume
	for n := range names {
		list = append(list, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: n, Annotations: map[string]string{annProvisionedBy: ProvisionerName, NodeAnnotation: node}}})
	}
	return p.annotate(ctx, node, NodeNames(node, list))
}

func (p *Provisioner) annotate(ctx context.Context, node, names string) error {
	patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, NamesAnnotation, names)
	_, err := p.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// dedupe keeps the first volume of each name.
func dedupe(pvs []*corev1.PersistentVolume) []*corev1.PersistentVolume {
	seen := map[string]bool{}
	out := pvs[:0:0]
	for _, pv := range pvs {
		if !seen[pv.Name] {
			seen[pv.Name] = true
			out = append(out, pv)
		}
	}
	return out
}
