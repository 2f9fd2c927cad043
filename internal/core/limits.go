package core

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericregistry "k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
)

// Size limits of a request and of a stored object. The API server reads at most
// MaxRequestBodyBytes of a body and answers 413 RequestEntityTooLarge past it, as
// kube-apiserver does for its own (3 MiB) limit. Upstream's limit is above etcd's (1.5 MiB),
// so a 2 MiB object passes it and comes back from etcd as a raw gRPC ResourceExhausted; here
// etcd takes writes up to etcdMaxRequestBytes, the most the API server's etcd client sends,
// so the limit a client meets is the API server's, with its size in the answer. The margin is
// for what storage adds to a body (managed fields, status).
const (
	// MaxRequestBodyBytes is the largest request body the core's API server reads: etcd's
	// default object limit, the figure Kubernetes users know.
	MaxRequestBodyBytes = 3 << 19 // 1.5 MiB
	etcdMaxRequestBytes = 2 << 20 // clientv3's default MaxCallSendMsgSize
)

// refuseCustomResourceProtobuf answers 415 UnsupportedMediaType to a request that sends a
// protobuf body to a custom resource. Custom resources have no protobuf form, yet
// apiextensions-apiserver lists protobuf among a CR endpoint's serializers (for the meta
// types it answers with) and decodes such a body through a nil strict decoder, which
// panics the handler and drops the connection. Every group this server serves but its own
// apiextensions.k8s.io is custom resources.
func refuseCustomResourceProtobuf(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Body != nil && req.ContentLength != 0 && isProtobuf(req.Header.Get("Content-Type")) {
			if group, ok := apiGroupOf(req.URL.Path); ok && group != "apiextensions.k8s.io" {
				err := apierrors.NewGenericServerResponse(http.StatusUnsupportedMediaType, req.Method,
					schema.GroupResource{Group: group}, "", fmt.Sprintf(
						"custom resources have no protobuf form: send the body as application/json, application/yaml or application/cbor, not %s",
						req.Header.Get("Content-Type")), 0, false)
				err.ErrStatus.Reason = "UnsupportedMediaType"
				responsewriters.ErrorNegotiated(err, apiextensionsapiserver.Codecs, schema.GroupVersion{Group: group}, w, req)
				return
			}
		}
		next.ServeHTTP(w, req)
	})
}

func isProtobuf(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == runtime.ContentTypeProtobuf
}

// apiGroupOf is the group of a request to /apis/<group>/...
func apiGroupOf(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/apis/")
	if !ok {
		return "", false
	}
	group, _, _ := strings.Cut(rest, "/")
	return group, group != ""
}

// tooLargeOptions gives every custom resource's storage tooLargeStorage.
type tooLargeOptions struct {
	genericregistry.RESTOptionsGetter
}

func (g tooLargeOptions) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (genericregistry.RESTOptions, error) {
	o, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil || o.Decorator == nil {
		return o, err
	}
	decorate := o.Decorator
	o.Decorator = func(cfg *storagebackend.ConfigForResource, prefix string, keyFunc func(runtime.Object) (string, error),
		newFunc, newListFunc func() runtime.Object, attrs storage.AttrFunc, trigger storage.IndexerFuncs, indexers *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
		s, destroy, err := decorate(cfg, prefix, keyFunc, newFunc, newListFunc, attrs, trigger, indexers)
		if err != nil {
			return s, destroy, err
		}
		return tooLargeStorage{Interface: s}, destroy, nil
	}
	return o, nil
}

// tooLargeStorage answers a write etcd refuses for its size with 413 and the limit. A body
// within MaxRequestBodyBytes fits; an object can still grow past etcd's limit by patches,
// and upstream then answers 500 with the raw gRPC message.
type tooLargeStorage struct{ storage.Interface }

func (s tooLargeStorage) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	return tooLargeError(s.Interface.Create(ctx, key, obj, out, ttl))
}

func (s tooLargeStorage) GuaranteedUpdate(ctx context.Context, key string, dest runtime.Object, ignoreNotFound bool,
	precond *storage.Preconditions, tryUpdate storage.UpdateFunc, cached runtime.Object) error {
	return tooLargeError(s.Interface.GuaranteedUpdate(ctx, key, dest, ignoreNotFound, precond, tryUpdate, cached))
}

// tooLargeError is err, or a RequestEntityTooLarge when it is etcd's refusal of a request's
// size: etcd's own ("request is too large") or gRPC's on either side of the connection.
func tooLargeError(err error) error {
	if err == nil {
		return nil
	}
	tooLarge := err.Error() == rpctypes.ErrRequestTooLarge.Error()
	if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "message larger than max") {
		tooLarge = true
	}
	if !tooLarge {
		return err
	}
	return apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("the object would be larger than the %d bytes storage holds (etcd: %v)", etcdMaxRequestBytes, err))
}

// largeBodyBytes is the size past which a request body counts as large: upstream's figure
// for the 99th percentile of an object's size (256 KiB), far above what the controllers write.
const largeBodyBytes = 256 << 10

// limitLargeBodies lets at most n requests with a large body (over largeBodyBytes, or of a
// length the client does not declare) past it at once; the others wait for one to finish,
// before their body is read. A large body costs the API server far more memory than its size
// while it is decoded, converted and validated (1.2 MB of YAML listing 20000 items took
// 100 MiB and 2.5 s of CPU), and that work is bound by the CPUs: more of it at once than there
// are CPUs finishes no sooner, it only holds more heap at the same time (a burst of 32 grew
// the heap to 1 GiB, and the Go runtime keeps a heap it grew to for minutes). A request still
// waiting at its deadline gives up without reading its body: the request timeout answers it
// 504, or, where none did, the wait answers 429 with a Retry-After as the in-flight limit does.
func limitLargeBodies(next http.Handler, n int) http.Handler {
	slots := make(chan struct{}, n)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Body == nil || req.Body == http.NoBody || (req.ContentLength >= 0 && req.ContentLength <= largeBodyBytes) {
			next.ServeHTTP(w, req)
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
			next.ServeHTTP(w, req)
		case <-req.Context().Done():
			// Usually the timeout filter has answered 504 by now, and this answer goes nowhere.
			group, _ := apiGroupOf(req.URL.Path)
			err := apierrors.NewTooManyRequests("the API server is busy with other large request bodies; try again", 1)
			responsewriters.ErrorNegotiated(err, apiextensionsapiserver.Codecs, schema.GroupVersion{Group: group}, w, req)
		}
	})
}
