package core

import (
	"sort"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/apiserver/pkg/endpoints/discovery/aggregated"
	"k8s.io/client-go/tools/cache"
)

// serveRootDiscovery serves /apis. apiextensions-apiserver turns discovery off and expects
// kube-apiserver's aggregator to list groups; alone, kubectl fails with "couldn't get current
// server API group list". The aggregated form is already kept by the CRD discovery
// controller; the legacy form (a plain APIGroupList) is kept here from the CRD informer.
func serveRootDiscovery(s *apiextensionsapiserver.CustomResourceDefinitions) {
	g := s.GenericAPIServer
	legacy := g.DiscoveryGroupManager
	groups := &crdGroups{manager: legacy, versions: map[string]map[string]int{}}
	_, _ = s.Informers.Apiextensions().V1().CustomResourceDefinitions().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { groups.add(obj) },
		UpdateFunc: func(old, obj any) {
			groups.remove(old)
			groups.add(obj)
		},
		DeleteFunc: func(obj any) { groups.remove(obj) },
	})
	g.Handler.NonGoRestfulMux.Unregister("/apis")
	g.Handler.NonGoRestfulMux.Handle("/apis", aggregated.WrapAggregatedDiscoveryToHandler(legacy, g.AggregatedDiscoveryGroupManager, nil))
}

// crdGroups counts served versions per group so that a group leaves discovery only when its
// last CRD does.
type crdGroups struct {
	mu      sync.Mutex
	manager interface {
		AddGroup(metav1.APIGroup)
		RemoveGroup(string)
	}
	versions map[string]map[string]int
}

func crdOf(obj any) *apiextensionsv1.CustomResourceDefinition {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	crd, _ := obj.(*apiextensionsv1.CustomResourceDefinition)
	return crd
}

func (c *crdGroups) add(obj any) {
	crd := crdOf(obj)
	if crd == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	vs := c.versions[crd.Spec.Group]
	if vs == nil {
		vs = map[string]int{}
		c.versions[crd.Spec.Group] = vs
	}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			vs[v.Name]++
		}
	}
	c.publish(crd.Spec.Group)
}

func (c *crdGroups) remove(obj any) {
	crd := crdOf(obj)
	if crd == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	vs := c.versions[crd.Spec.Group]
	for _, v := range crd.Spec.Versions {
		if v.Served && vs != nil {
			if vs[v.Name]--; vs[v.Name] <= 0 {
				delete(vs, v.Name)
			}
		}
	}
	c.publish(crd.Spec.Group)
}

func (c *crdGroups) publish(group string) {
	vs := c.versions[group]
	if len(vs) == 0 {
		delete(c.versions, group)
		c.manager.RemoveGroup(group)
		return
	}
	names := make([]string, 0, len(vs))
	for v := range vs {
		names = append(names, v)
	}
	sort.Slice(names, func(i, j int) bool { return version.CompareKubeAwareVersionStrings(names[i], names[j]) > 0 })
	apiGroup := metav1.APIGroup{Name: group}
	for _, v := range names {
		apiGroup.Versions = append(apiGroup.Versions, metav1.GroupVersionForDiscovery{GroupVersion: group + "/" + v, Version: v})
	}
	apiGroup.PreferredVersion = apiGroup.Versions[0]
	c.manager.AddGroup(apiGroup)
}
