package core

import (
	"fmt"
	"mime"
	"net/http"
	"strings"

	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
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
