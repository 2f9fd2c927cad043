package manager

import (
	"errors"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// authzRefusal builds the error an API server's authorization filter returns, with the
// upstream wording (k8s.io/apiserver responsewriters.forbiddenMessage).
func authzRefusal(user, verb, resource, group, ns string) error {
	scope := "at the cluster scope"
	if ns != "" {
		scope = fmt.Sprintf("in the namespace %q", ns)
	}
	msg := fmt.Sprintf("User %q cannot %s resource %q in API group %q %s", user, verb, resource, group, scope)
	return apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, "", errors.New(msg))
}

func TestAsForbidden(t *testing.T) {
	sa := "system:serviceaccount:x:y"
	rows := []struct {
		name string
		err  error
		want string // "" when not an authorization refusal
	}{
		{"cluster-scoped list of a CRD", authzRefusal(sa, "list", "computecontracts", "socialweb.computer", ""),
			"forbidden: list computecontracts.socialweb.computer as system:serviceaccount:x:y: grant it (see config/rbac)"},
		{"as an informer wraps it", fmt.Errorf("failed to list *v1alpha1.Infra: %w", authzRefusal(sa, "list", "infras", "socialweb.computer", "")),
			"forbidden: list infras.socialweb.computer as system:serviceaccount:x:y: grant it (see config/rbac)"},
		{"namespaced Lease of the core of coordination", authzRefusal(sa, "get", "leases", "coordination.k8s.io", "kube-system"),
			"forbidden: get leases.coordination.k8s.io in namespace kube-system as system:serviceaccount:x:y: grant it (see config/rbac)"},
		{"core group has no suffix", authzRefusal("alice", "watch", "secrets", "", ""),
			"forbidden: watch secrets as alice: grant it (see config/rbac)"},
		{"subresource", authzRefusal(sa, "update", "infras/status", "socialweb.computer", "acct"),
			"forbidden: update infras/status.socialweb.computer in namespace acct as system:serviceaccount:x:y: grant it (see config/rbac)"},
		{"authorizer reason appended", fmt.Errorf("x: %w", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "",
			errors.New(`User "bob" cannot list resource "pods" in API group "" at the cluster scope: RBAC: clusterrole "view" not found`))),
			"forbidden: list pods as bob: grant it (see config/rbac)"},
		{"admission denial is not a permission", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p",
			errors.New(`admission webhook "deny.example.test" denied the request`)), ""},
		{"quota is not a permission", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p",
			errors.New("exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1")), ""},
		{"terminating namespace is not a permission", apierrors.NewForbidden(schema.GroupResource{Resource: "infras", Group: "socialweb.computer"}, "i",
			errors.New("unable to create new content in namespace acct because it is being terminated")), ""},
		{"not found", apierrors.NewNotFound(schema.GroupResource{Resource: "infras"}, "i"), ""},
		{"plain error", errors.New(`User "a" cannot list resource "b" in API group "" at the cluster scope`), ""},
		{"nil", nil, ""},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			f, ok := AsForbidden(row.err)
			got := ""
			if ok {
				got = f.Error()
			}
			if got != row.want {
				t.Errorf("got %q, want %q", got, row.want)
			}
		})
	}
}

// A list an informer makes is refused whatever the server's wording: the resource comes
// from the status details.
func TestReadForbidden(t *testing.T) {
	odd := apierrors.NewForbidden(schema.GroupResource{Group: "socialweb.computer", Resource: "infras"}, "", errors.New("access denied by policy"))
	f, ok := readForbidden(fmt.Errorf("failed to list: %w", odd))
	if !ok || f.Error() != "forbidden: list infras.socialweb.computer: grant it (see config/rbac)" {
		t.Errorf("got %v %v", f, ok)
	}
	if _, ok := readForbidden(apierrors.NewInternalError(errors.New("etcd"))); ok {
		t.Error("a 500 is not a refusal")
	}
}

func TestLeaseHolder(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := func(v string) *string { return &v }
	at := func(ago time.Duration) *metav1.MicroTime { m := metav1.NewMicroTime(now.Add(-ago)); return &m }
	d := func(v int32) *int32 { return &v }
	rows := []struct {
		name     string
		holder   *string
		renew    *metav1.MicroTime
		duration *int32
		want     string
	}{
		{"renewed within its duration", s("host_a"), at(3 * time.Second), d(10), "host_a"},
		{"expired", s("host_a"), at(11 * time.Second), d(10), ""},
		{"released (holder cleared)", s(""), at(time.Second), d(1), ""},
		{"no holder", nil, at(time.Second), d(10), ""},
		{"never renewed", s("host_a"), nil, d(10), ""},
		{"no duration: ours", s("host_a"), at(5 * time.Second), nil, "host_a"},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if got, _ := leaseHolder(row.holder, row.renew, row.duration, now); got != row.want {
				t.Errorf("got %q, want %q", got, row.want)
			}
		})
	}
}

func TestLeaderElectionTimings(t *testing.T) {
	// client-go's own validation: LeaseDuration > RenewDeadline > 1.2 × RetryPeriod.
	if !(LeaseDuration > RenewDeadline && float64(RenewDeadline) > 1.2*float64(RetryPeriod)) {
		t.Fatalf("timings %s/%s/%s are rejected by client-go", LeaseDuration, RenewDeadline, RetryPeriod)
	}
	// A graceful handover is one retry of a waiting replica after the release.
	if 2.2*float64(RetryPeriod) >= float64(5*time.Second) {
		t.Errorf("retry period %s makes a handover slower than 5 s", RetryPeriod)
	}
}
