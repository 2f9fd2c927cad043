package kube

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/metrics/pkg/apis/metrics"
	metricsinstall "k8s.io/metrics/pkg/apis/metrics/install"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"socialweb.computer/internal/tenant/resourcemetrics"
)

// The Metrics API (metrics.k8s.io/v1beta1: nodes and pods), which `kubectl top` and the
// HorizontalPodAutoscaler read, is served by the tenant apiserver itself: the group is
// installed on the aggregator's own server (like apiregistration.k8s.io), so it needs no
// port, no Service, no APIService and no second process. Its figures come from the kubelets'
// /metrics/resource, scraped every metricsPeriod through the apiserver's node proxy (the
// same path `kubectl logs` takes to a kubelet) and kept for two periods in memory
// (internal/tenant/resourcemetrics). What metrics-server does, without its dependencies.
// docs/metrics.md.

const (
	metricsPeriod      = 10 * time.Second
	metricsHook        = "socialweb/resource-metrics"
	metricsScrapeLimit = 5 * time.Second
)

var (
	metricsScheme = runtime.NewScheme()
	metricsCodecs = serializer.NewCodecFactory(metricsScheme)
)

func init() {
	metricsinstall.Install(metricsScheme)
	metav1.AddToGroupVersion(metricsScheme, schema.GroupVersion{Version: "v1"})
}

// resourceMetrics is the Metrics API's source: the store the scraper fills and a client of
// the apiserver (its loopback identity) that lists nodes and pods when asked.
type resourceMetrics struct {
	store *resourcemetrics.Store
	mu    sync.RWMutex
	// client is set once the apiserver runs (the post-start hook); until then the API
	// answers with no figures.
	client clientset.Interface
}

func (m *resourceMetrics) clientset() (clientset.Interface, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.client == nil {
		return nil, apierrors.NewServiceUnavailable("the Metrics API is starting")
	}
	return m.client, nil
}

// installMetricsAPI installs metrics.k8s.io on s and registers the hook that starts the
// scraper.
func installMetricsAPI(s *genericapiserver.GenericAPIServer) error {
	m := &resourceMetrics{store: resourcemetrics.NewStore()}
	info := genericapiserver.NewDefaultAPIGroupInfo(metrics.GroupName, metricsScheme, metav1.ParameterCodec, metricsCodecs)
	info.VersionedResourcesStorageMap[metricsv1beta1.SchemeGroupVersion.Version] = map[string]rest.Storage{
		"nodes": &nodeMetricsREST{m: m, TableConvertor: rest.NewDefaultTableConvertor(metrics.Resource("nodes"))},
		"pods":  &podMetricsREST{m: m, TableConvertor: rest.NewDefaultTableConvertor(metrics.Resource("pods"))},
	}
	if err := s.InstallAPIGroup(&info); err != nil {
		return fmt.Errorf("installing metrics.k8s.io: %w", err)
	}
	return s.AddPostStartHook(metricsHook, func(hc genericapiserver.PostStartHookContext) error {
		client, err := clientset.NewForConfig(hc.LoopbackClientConfig)
		if err != nil {
			return err
		}
		m.mu.Lock()
		m.client = client
		m.mu.Unlock()
		go m.scrapeEvery(hc, metricsPeriod)
		return nil
	})
}

// scrapeEvery scrapes every node each period until ctx ends.
func (m *resourceMetrics) scrapeEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		m.scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *resourceMetrics) scrape(ctx context.Context) {
	client, err := m.clientset()
	if err != nil {
		return
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		klog.V(2).InfoS("resource metrics: listing nodes", "err", err)
		return
	}
	keep := map[string]bool{}
	var wg sync.WaitGroup
	for i := range nodes.Items {
		name := nodes.Items[i].Name
		keep[name] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, metricsScrapeLimit)
			defer cancel()
			at := time.Now()
			raw, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", name, "proxy", "metrics", "resource").DoRaw(sctx)
			if err != nil {
				klog.V(2).InfoS("resource metrics: scraping", "node", name, "err", err)
				return
			}
			r, err := resourcemetrics.Parse(string(raw), at)
			if err != nil {
				klog.InfoS("resource metrics: reading", "node", name, "err", err)
				return
			}
			m.store.Add(name, r)
		}()
	}
	wg.Wait()
	m.store.Forget(keep)
}

func usageList(u resourcemetrics.Usage) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewScaledQuantity(u.NanoCores, resource.Nano),
		corev1.ResourceMemory: *resource.NewQuantity(u.MemoryBytes, resource.BinarySI),
	}
}

func listOptions(o *metainternalversion.ListOptions) metav1.ListOptions {
	var out metav1.ListOptions
	if o == nil {
		return out
	}
	if o.LabelSelector != nil {
		out.LabelSelector = o.LabelSelector.String()
	}
	if o.FieldSelector != nil {
		// metadata.name is the one field both Node and Pod lists and the API both know.
		if v, ok := o.FieldSelector.RequiresExactMatch("metadata.name"); ok {
			out.FieldSelector = fields.OneTermEqualSelector("metadata.name", v).String()
		}
	}
	return out
}

// nodeMetricsREST serves metrics.k8s.io nodes, read-only.
type nodeMetricsREST struct {
	m *resourceMetrics
	rest.TableConvertor
}

var (
	_ rest.Storage              = (*nodeMetricsREST)(nil)
	_ rest.Getter               = (*nodeMetricsREST)(nil)
	_ rest.Lister               = (*nodeMetricsREST)(nil)
	_ rest.Scoper               = (*nodeMetricsREST)(nil)
	_ rest.KindProvider         = (*nodeMetricsREST)(nil)
	_ rest.SingularNameProvider = (*nodeMetricsREST)(nil)
)

func (r *nodeMetricsREST) New() runtime.Object     { return &metrics.NodeMetrics{} }
func (r *nodeMetricsREST) NewList() runtime.Object { return &metrics.NodeMetricsList{} }
func (r *nodeMetricsREST) Destroy()                {}
func (r *nodeMetricsREST) Kind() string            { return "NodeMetrics" }
func (r *nodeMetricsREST) NamespaceScoped() bool   { return false }
func (r *nodeMetricsREST) GetSingularName() string { return "node" }
func (r *nodeMetricsREST) node(n *corev1.Node) (metrics.NodeMetrics, bool) {
	u, ok := r.m.store.Node(n.Name)
	if !ok {
		return metrics.NodeMetrics{}, false
	}
	return metrics.NodeMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, CreationTimestamp: metav1.NewTime(time.Now())},
		Timestamp:  metav1.NewTime(u.Timestamp),
		Window:     metav1.Duration{Duration: u.Window},
		Usage:      usageList(u),
	}, true
}

func (r *nodeMetricsREST) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	client, err := r.m.clientset()
	if err != nil {
		return nil, err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, listOptions(o))
	if err != nil {
		return nil, err
	}
	out := &metrics.NodeMetricsList{}
	for i := range nodes.Items {
		if nm, ok := r.node(&nodes.Items[i]); ok {
			out.Items = append(out.Items, nm)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool { return out.Items[i].Name < out.Items[j].Name })
	return out, nil
}

func (r *nodeMetricsREST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	client, err := r.m.clientset()
	if err != nil {
		return nil, err
	}
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	nm, ok := r.node(n)
	if !ok {
		return nil, apierrors.NewNotFound(metrics.Resource("nodes"), name)
	}
	return &nm, nil
}

// podMetricsREST serves metrics.k8s.io pods, read-only.
type podMetricsREST struct {
	m *resourceMetrics
	rest.TableConvertor
}

var (
	_ rest.Storage              = (*podMetricsREST)(nil)
	_ rest.Getter               = (*podMetricsREST)(nil)
	_ rest.Lister               = (*podMetricsREST)(nil)
	_ rest.Scoper               = (*podMetricsREST)(nil)
	_ rest.KindProvider         = (*podMetricsREST)(nil)
	_ rest.SingularNameProvider = (*podMetricsREST)(nil)
)

func (r *podMetricsREST) New() runtime.Object     { return &metrics.PodMetrics{} }
func (r *podMetricsREST) NewList() runtime.Object { return &metrics.PodMetricsList{} }
func (r *podMetricsREST) Destroy()                {}
func (r *podMetricsREST) Kind() string            { return "PodMetrics" }
func (r *podMetricsREST) NamespaceScoped() bool   { return true }
func (r *podMetricsREST) GetSingularName() string { return "pod" }

func (r *podMetricsREST) pod(p *corev1.Pod) (metrics.PodMetrics, bool) {
	cs, ok := r.m.store.Pod(p.Namespace, p.Name)
	if !ok {
		return metrics.PodMetrics{}, false
	}
	pm := metrics.PodMetrics{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, CreationTimestamp: metav1.NewTime(time.Now())},
		Timestamp:  metav1.NewTime(cs[0].Timestamp),
		Window:     metav1.Duration{Duration: cs[0].Window},
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name })
	for _, c := range cs {
		if c.Timestamp.Before(pm.Timestamp.Time) {
			pm.Timestamp = metav1.NewTime(c.Timestamp)
		}
		pm.Containers = append(pm.Containers, metrics.ContainerMetrics{Name: c.Name, Usage: usageList(c.Usage)})
	}
	return pm, true
}

func (r *podMetricsREST) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	client, err := r.m.clientset()
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods(genericapirequest.NamespaceValue(ctx)).List(ctx, listOptions(o))
	if err != nil {
		return nil, err
	}
	out := &metrics.PodMetricsList{}
	for i := range pods.Items {
		if pm, ok := r.pod(&pods.Items[i]); ok {
			out.Items = append(out.Items, pm)
		}
	}
	sort.Slice(out.Items, func(i, j int) bool {
		if out.Items[i].Namespace != out.Items[j].Namespace {
			return out.Items[i].Namespace < out.Items[j].Namespace
		}
		return out.Items[i].Name < out.Items[j].Name
	})
	return out, nil
}

func (r *podMetricsREST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	client, err := r.m.clientset()
	if err != nil {
		return nil, err
	}
	ns := genericapirequest.NamespaceValue(ctx)
	p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	pm, ok := r.pod(p)
	if !ok {
		return nil, apierrors.NewNotFound(metrics.Resource("pods"), ns+"/"+name)
	}
	return &pm, nil
}

// withMetricsDefinitions adds the OpenAPI definitions of metrics.k8s.io/v1beta1 to get
// (the apiserver builds its OpenAPI documents from every installed group, and Kubernetes'
// generated definitions do not include this one).
func withMetricsDefinitions(get common.GetOpenAPIDefinitions) common.GetOpenAPIDefinitions {
	if get == nil {
		return nil
	}
	return func(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		defs := get(ref)
		for k, v := range metricsDefinitions(ref) {
			defs[k] = v
		}
		return defs
	}
}
