package tenant

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// RevokeIdentity deletes the DID's ServiceAccount, strips the DID (as a user) and that
// ServiceAccount from every binding, deletes the bindings left empty, and leaves everything
// else alone; a second call removes nothing more.
func TestRevokeIdentity(t *testing.T) {
	const did, other = "did:plc:revoked", "did:plc:kept"
	sa, otherSA := OwnerServiceAccount(did), OwnerServiceAccount(other)
	user := func(n string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: n}
	}
	acct := func(n string) rbacv1.Subject {
		return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: n, Namespace: OwnerNamespace}
	}
	cs := fake.NewSimpleClientset(
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: OwnerNamespace, Name: sa}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: OwnerNamespace, Name: otherSA}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: OwnerBinding}, Subjects: []rbacv1.Subject{user(did), acct(sa)}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, Subjects: []rbacv1.Subject{user(did), user(other), acct(otherSA)}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "unrelated"}, Subjects: []rbacv1.Subject{user(other)}},
		// A ServiceAccount of the same name in another namespace is another identity.
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "elsewhere"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: "default"}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine"}, Subjects: []rbacv1.Subject{acct(sa)}},
	)
	ctx := context.Background()
	removed, err := RevokeIdentity(ctx, cs, did, Attribution{})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{"clusterrolebinding/shared", "clusterrolebinding/" + OwnerBinding, "rolebinding/default/mine", "serviceaccount/" + OwnerNamespace + "/" + sa}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	if _, err := cs.CoreV1().ServiceAccounts(OwnerNamespace).Get(ctx, sa, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the revoked ServiceAccount: %v", err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(OwnerNamespace).Get(ctx, otherSA, metav1.GetOptions{}); err != nil {
		t.Errorf("another identity's ServiceAccount: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, OwnerBinding, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the owner binding left with no subject: %v", err)
	}
	shared, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, "shared", metav1.GetOptions{})
	if err != nil || !slices.Equal(shared.Subjects, []rbacv1.Subject{user(other), acct(otherSA)}) {
		t.Errorf("shared binding %+v %v", shared, err)
	}
	if b, err := cs.RbacV1().RoleBindings("default").Get(ctx, "elsewhere", metav1.GetOptions{}); err != nil || len(b.Subjects) != 1 {
		t.Errorf("a namesake ServiceAccount in another namespace was touched: %+v %v", b, err)
	}
	if _, err := cs.RbacV1().RoleBindings("default").Get(ctx, "mine", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a RoleBinding of only the revoked ServiceAccount: %v", err)
	}
	if again, err := RevokeIdentity(ctx, cs, did, Attribution{}); err != nil || len(again) != 0 {
		t.Errorf("second revoke: %v %v, want nothing removed", again, err)
	}
}
