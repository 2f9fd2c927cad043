package gateway

import (
	"context"
	"encoding/json"
	"errors"

	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"unicode/utf8"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/tenant"
)

// Errors of the computer.socialweb.k8s family, besides the shared ones.
const (
	ErrForbidden     = "Forbidden"
	ErrApplyConflict = "ApplyConflict"
	ErrJobNotFound   = "JobNotFound"
)

// maxLog is the most of one container's log getJob returns: its last 64 KiB.
const maxLog = 64 << 10

func (s *Server) k8sMethods() map[string]method {
	return map[string]method{
		cluster.KubectlApplyServerSideNSID: {procedure: true, call: func(ctx context.Context, account string, in []byte, _ url.Values) (any, error) {
			return s.kubectlApplyServerSide(ctx, account, in)
		}},
		cluster.GetJobNSID: {call: func(ctx context.Context, account string, _ []byte, q url.Values) (any, error) {
			return s.getJob(ctx, account, q)
		}},
	}
}

// onBehalfOf is a rest.Config for the caller's Ready (or Sleeping) cluster that acts as the caller's own
// ServiceAccount (the cluster's admin identity impersonating it), through the cluster's gate:
// what the gateway does for a caller is bounded by the RBAC the caller's ServiceAccount has.
func (s *Server) onBehalfOf(ctx context.Context, account, name string) (*rest.Config, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	c, err := s.lookup(ctx, account, name)
	if err != nil {
		return nil, err
	}
	if err := revoked(c, account); err != nil {
		return nil, err
	}
	// A Sleeping cluster's gate holds the request and wakes it: the call is late, not refused.
	awake := c.Status.Phase == v1alpha1.ClusterReady || c.Status.Phase == v1alpha1.ClusterSleeping
	if !c.DeletionTimestamp.IsZero() || !awake || c.Status.Server == "" {
		return nil, notReady("cluster %q is %s, not Ready", name, phaseOf(c))
	}
	p := &tenant.PKI{Dir: tenant.LayoutFor(s.cfg.TenantsRoot, c.Namespace, c.Name).PKI()}
	cfg := &rest.Config{
		Host: c.Status.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: p.Cert("ca"), CertFile: p.Cert("admin"), KeyFile: p.Key("admin"),
		},
		Impersonate: rest.ImpersonationConfig{UserName: "system:serviceaccount:" + tenant.OwnerNamespace + ":" + tenant.OwnerServiceAccount(account)},
		QPS:         20, Burst: 40, Timeout: 30 * time.Second,
	}
	if c.Status.Phase == v1alpha1.ClusterSleeping {
		// The asleep gate holds a client's connection while the cluster wakes, but the
		// client's TLS handshake gives up after 10 s, and a wake on a busy host takes
		// longer: wait here until the apiserver answers, then make the call.
		if err := awaitServing(ctx, cfg, name); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// wakeWait bounds how long a call waits for a Sleeping cluster to serve.
const wakeWait = time.Minute

// awaitServing asks the cluster's apiserver for /readyz through its gate (the first
// connection to an asleep gate wakes it) until it answers 200, for up to wakeWait.
func awaitServing(ctx context.Context, cfg *rest.Config, name string) error {
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: rt, Timeout: 15 * time.Second}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, wakeWait, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.Host+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil // not serving yet: the gate holds, or the wake is under way
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if wait.Interrupted(err) {
		return notReady("cluster %q is waking; try again", name)
	}
	return err
}

// tenantErr turns an error of the tenant apiserver into an XRPC error; its message is the
// apiserver's own (it speaks to the caller's own cluster, so it leaks nothing).
func tenantErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) || errors.Is(err, context.DeadlineExceeded) {
		// No answer (a wake slower than the client's timeout, an apiserver restarting): the
		// caller tries again, as after any NotReady. The apiserver's address is the host's
		// own and stays out of the message.
		why := "the connection failed"
		if errors.Is(err, context.DeadlineExceeded) || (ue != nil && ue.Timeout()) {
			why = "it timed out"
		}
		return notReady("the cluster's API server did not answer (%s); try again", why)
	}
	var se apierrors.APIStatus
	if !errors.As(err, &se) {
		return err
	}
	switch code := se.Status().Code; {
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return xrpcErr(http.StatusForbidden, ErrForbidden, "%s", se.Status().Message)
	case apierrors.IsConflict(err):
		return xrpcErr(http.StatusConflict, ErrApplyConflict, "%s", se.Status().Message)
	case code >= 400 && code < 500:
		return invalidRequest("%s", se.Status().Message)
	case code == http.StatusServiceUnavailable || code == http.StatusBadGateway:
		return notReady("the cluster's API server answered %d: %s", code, se.Status().Message)
	}
	return err
}

func (s *Server) kubectlApplyServerSide(ctx context.Context, account string, in []byte) (any, error) {
	var v cluster.KubectlApplyServerSideInput
	if err := decodeInput(in, &v); err != nil {
		return nil, err
	}
	var obj unstructured.Unstructured
	if len(v.Manifest) == 0 || json.Unmarshal(v.Manifest, &obj.Object) != nil || obj.Object == nil {
		return nil, invalidRequest("manifest must be one Kubernetes object as a JSON object")
	}
	gvk := obj.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, invalidRequest("manifest needs apiVersion and kind")
	}
	if obj.IsList() {
		return nil, invalidRequest("manifest is a list; apply one object per call")
	}
	if v.Name != nil {
		obj.SetName(*v.Name)
	}
	if v.Namespace != nil {
		obj.SetNamespace(*v.Namespace)
	}
	if obj.GetName() == "" {
		return nil, invalidRequest("manifest has no metadata.name (and no name was given)")
	}
	manager := cluster.KubectlApplyServerSideInputFieldManagerDefault
	if v.FieldManager != nil && *v.FieldManager != "" {
		manager = *v.FieldManager
	}
	if len(manager) > 128 {
		return nil, invalidRequest("fieldManager is longer than 128 bytes")
	}
	cfg, err := s.onBehalfOf(ctx, account, v.Cluster)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapping, err := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)).RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		return nil, invalidRequest("the cluster serves no %s", gvk)
	}
	if err != nil {
		return nil, tenantErr(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		if errs := validation.IsDNS1123Label(obj.GetNamespace()); len(errs) > 0 {
			return nil, invalidRequest("namespace %q: %s", obj.GetNamespace(), errs[0])
		}
		ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	} else {
		obj.SetNamespace("")
	}
	opts := metav1.ApplyOptions{FieldManager: manager, Force: v.Force != nil && *v.Force}
	if v.DryRun != nil && *v.DryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	got, err := ri.Apply(ctx, obj.GetName(), &obj, opts)
	if err != nil {
		return nil, tenantErr(err)
	}
	raw, err := json.Marshal(got.Object)
	if err != nil {
		return nil, err
	}
	out := cluster.KubectlApplyServerSideOutput{APIVersion: got.GetAPIVersion(), Kind: got.GetKind(), Name: got.GetName(), Object: raw}
	if uid := string(got.GetUID()); uid != "" {
		out.UID = &uid
	}
	if rv := got.GetResourceVersion(); rv != "" {
		out.ResourceVersion = &rv
	}
	if g := got.GetGeneration(); g != 0 {
		out.Generation = &g
	}
	return out, nil
}

func (s *Server) getJob(ctx context.Context, account string, q url.Values) (any, error) {
	p := cluster.GetJobParams{Cluster: q.Get("cluster"), Namespace: q.Get("namespace"), Name: q.Get("name")}
	tail := int64(cluster.GetJobParamsTailLinesDefault)
	if t := q.Get("tailLines"); t != "" {
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil || n < 0 || n > 10000 {
			return nil, invalidRequest("tailLines %q is not an integer in 0..10000", t)
		}
		tail = n
	}
	if errs := validation.IsDNS1123Label(p.Namespace); len(errs) > 0 {
		return nil, invalidRequest("namespace %q: %s", p.Namespace, errs[0])
	}
	if errs := validation.IsDNS1123Subdomain(p.Name); len(errs) > 0 {
		return nil, invalidRequest("name %q: %s", p.Name, errs[0])
	}
	cfg, err := s.onBehalfOf(ctx, account, p.Cluster)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	job, err := cs.BatchV1().Jobs(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, xrpcErr(http.StatusBadRequest, ErrJobNotFound, "no job %s/%s in cluster %q", p.Namespace, p.Name, p.Cluster)
	}
	if err != nil {
		return nil, tenantErr(err)
	}
	out := cluster.GetJobOutput{Phase: jobPhase(job), Counts: &cluster.GetJobCounts{
		Active: ptr(int64(job.Status.Active)), Succeeded: ptr(int64(job.Status.Succeeded)), Failed: ptr(int64(job.Status.Failed)),
	}}
	for _, c := range job.Status.Conditions {
		jc := cluster.GetJobCondition{Type: string(c.Type), Status: string(c.Status)}
		if c.Reason != "" {
			jc.Reason = ptr(c.Reason)
		}
		if c.Message != "" {
			jc.Message = ptr(c.Message)
		}
		if !c.LastTransitionTime.IsZero() {
			jc.LastTransitionTime = ptr(c.LastTransitionTime.UTC().Format("2006-01-02T15:04:05Z"))
		}
		out.Conditions = append(out.Conditions, jc)
	}
	sel, err := metav1.LabelSelectorAsSelector(job.Spec.Selector)
	if err != nil {
		return nil, err
	}
	pods, err := cs.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, tenantErr(err)
	}
	for _, pod := range pods.Items {
		jp := cluster.GetJobPod{Name: pod.Name, Phase: ptr(string(pod.Status.Phase))}
		for _, c := range pod.Spec.Containers {
			jc := cluster.GetJobContainer{Name: c.Name}
			if pod.Spec.NodeName != "" {
				if l, err := containerLog(ctx, cs, &pod, c.Name, tail); err == nil {
					jc.Log = &l
				}
			}
			jp.Containers = append(jp.Containers, jc)
		}
		out.Pods = append(out.Pods, jp)
	}
	return out, nil
}

// jobPhase: Succeeded or Failed by the Job's terminal condition, Running while a pod runs,
// else Pending.
func jobPhase(j *batchv1.Job) string {
	for _, c := range j.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
			return "Succeeded"
		case batchv1.JobFailed, batchv1.JobFailureTarget:
			return "Failed"
		}
	}
	if j.Status.Ready != nil && *j.Status.Ready > 0 {
		return "Running"
	}
	return "Pending"
}

// containerLog is the last tail lines of a container's log, cut to its last 64 KiB on a
// character boundary.
func containerLog(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, container string, tail int64) (string, error) {
	rc, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container, TailLines: &tail}).Stream(ctx)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	return tailLog(io.LimitReader(rc, maxLogRead), maxLog)
}

// maxLogRead bounds what one container's log read takes from the apiserver (tailLines lines
// of any length); only the last maxLog bytes of it are kept.
const maxLogRead = 16 << 20

// tailLog reads r to its end and answers its last max bytes at most, starting on a character
// boundary (a multi-byte character cut by the cap is dropped whole). It holds at most two
// chunks of max bytes while it reads.
func tailLog(r io.Reader, max int) (string, error) {
	buf := make([]byte, 0, 2*max)
	chunk := make([]byte, 32<<10)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if len(buf) > 2*max {
			buf = append(buf[:0], buf[len(buf)-max:]...)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", err
		}
	}
	if len(buf) > max {
		buf = buf[len(buf)-max:]
		for len(buf) > 0 && !utf8.RuneStart(buf[0]) {
			buf = buf[1:]
		}
	}
	return string(buf), nil
}

func ptr[T any](v T) *T { return &v }
