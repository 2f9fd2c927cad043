package console

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

// TenantObjects are what the console reads inside one tenant cluster.
type TenantObjects struct {
	Nodes []corev1.Node
	Pods  []corev1.Pod
}

// TenantsToWatch are the tenant clusters (namespace/name) whose insides the console
// watches: the Ready ones. A cluster that is starting, stopped or draining has no apiserver
// to watch, or one about to go.
func TenantsToWatch(clusters []v1alpha1.Cluster) map[string]bool {
	out := map[string]bool{}
	for _, c := range clusters {
		if c.Status.Phase == v1alpha1.ClusterReady {
			out[c.Namespace+"/"+c.Name] = true
		}
	}
	return out
}

// PendingPods are the pods no node took yet, by namespace and name.
func PendingPods(pods []corev1.Pod) []PendingPodRow {
	var out []PendingPodRow
	for _, p := range pods {
		if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			continue
		}
		row := PendingPodRow{Namespace: p.Namespace, Name: p.Name}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				row.Reason = cmp.Or(c.Message, c.Reason)
			}
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b PendingPodRow) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// TenantNodes are a cluster's Node objects, by name, with their readiness and pod count.
func TenantNodes(t TenantObjects) []TenantNodeRow {
	pods := map[string]int{}
	for _, p := range t.Pods {
		if p.Spec.NodeName != "" && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			pods[p.Spec.NodeName]++
		}
	}
	var out []TenantNodeRow
	for _, n := range t.Nodes {
		row := TenantNodeRow{Name: n.Name, Ready: "Unknown", Pods: pods[n.Name]}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				row.Ready = string(c.Status)
			}
		}
		out = append(out, row)
	}
	slices.SortFunc(out, func(a, b TenantNodeRow) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// tenantWatch is a pair of informers (nodes, pods) on one tenant cluster's apiserver.
type tenantWatch struct {
	stop  chan struct{}
	nodes corelisters.NodeLister
	pods  corelisters.PodLister
}

// syncTenants starts a watch of every cluster TenantsToWatch names and stops the others.
// Called with c.mu held.
func (c *Console) syncTenants(clusters []v1alpha1.Cluster) {
	if c.o.TenantConfig == nil {
		return
	}
	want := TenantsToWatch(clusters)
	for k, w := range c.tenants {
		if !want[k] {
			close(w.stop)
			delete(c.tenants, k)
		}
	}
	for k := range want {
		if _, ok := c.tenants[k]; ok {
			continue
		}
		ns, name, _ := strings.Cut(k, "/")
		cfg, err := c.o.TenantConfig(ns, name)
		if err != nil {
			c.o.Logger.Debug("console: tenant cluster not watched", "cluster", k, "err", err)
			continue
		}
		cfg.Timeout = 0 // a watch is one long request
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			c.o.Logger.Debug("console: tenant cluster not watched", "cluster", k, "err", err)
			continue
		}
		f := informers.NewSharedInformerFactory(cs, 0)
		w := &tenantWatch{stop: make(chan struct{}), nodes: f.Core().V1().Nodes().Lister(), pods: f.Core().V1().Pods().Lister()}
		for _, inf := range []toolscache.SharedIndexInformer{f.Core().V1().Nodes().Informer(), f.Core().V1().Pods().Informer()} {
			if _, err := inf.AddEventHandler(c.handler()); err != nil {
				c.o.Logger.Debug("console: tenant cluster not watched", "cluster", k, "err", err)
			}
		}
		f.Start(w.stop)
		c.tenants[k] = w
	}
}

// tenantObjects reads what the watches hold. Called with c.mu held.
func (c *Console) tenantObjects() map[string]TenantObjects {
	out := map[string]TenantObjects{}
	for k, w := range c.tenants {
		var t TenantObjects
		if ns, err := w.nodes.List(labels.Everything()); err == nil {
			for _, n := range ns {
				t.Nodes = append(t.Nodes, *n)
			}
		}
		if ps, err := w.pods.List(labels.Everything()); err == nil {
			for _, p := range ps {
				t.Pods = append(t.Pods, *p)
			}
		}
		out[k] = t
	}
	return out
}

func (c *Console) stopTenants() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, w := range c.tenants {
		close(w.stop)
		delete(c.tenants, k)
	}
}
