package gateway

import (
	"context"
	"errors"
	"net/url"
	"sort"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/controllers/manager"
)

// FuzzMethodInputs: any input to any method, after authentication, answers a typed XRPC
// error or a result, and never panics. The core is a fake client holding one cluster of the
// caller's and one of another account's.
func FuzzMethodInputs(f *testing.F) {
	const me, other = "did:plc:fuzzme", "did:plc:fuzzother"
	cl := fake.NewClientBuilder().WithScheme(manager.Scheme()).WithObjects(
		&v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: AccountNamespace(me), Name: "c1"},
			Spec: v1alpha1.ClusterSpec{Account: me, Name: "c1", Running: true}},
		&v1alpha1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: AccountNamespace(me), Name: "c2"},
			Spec: v1alpha1.ClusterSpec{Account: other, Name: "c2"}},
	).Build()
	s := &Server{cfg: Config{Client: cl, TenantsRoot: f.TempDir()}}
	s.methods = s.clusterMethods()
	for nsid, m := range s.k8sMethods() {
		s.methods[nsid] = m
	}
	var nsids []string
	for n, m := range s.methods {
		if m.call != nil {
			nsids = append(nsids, n)
		}
	}
	sort.Strings(nsids)
	for i := range nsids {
		for _, in := range []string{`{"name":"c1"}`, `{"name":"c2","ttlSeconds":60}`, `{"cluster":"c1","manifest":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}}`,
			`{"name":"c1","noExpiry":true}`, `{"name":"c1","publish":false}`, `{`, `null`, `{"name":null}`, `{"name":"` + "\xff" + `"}`} {
			f.Add(uint8(i), []byte(in), "cluster=c1&namespace=default&name=j&tailLines=5")
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, in []byte, query string) {
		m := s.methods[nsids[int(which)%len(nsids)]]
		q, _ := url.ParseQuery(query)
		if !m.procedure {
			in = nil
		}
		_, err := m.call(context.Background(), me, in, q)
		var xe *Error
		if err != nil && !errors.As(err, &xe) {
			t.Fatalf("%s(%q, %q): untyped error %v", nsids[int(which)%len(nsids)], in, query, err)
		}
	})
}
