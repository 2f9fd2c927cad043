package kube

import (
	"context"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
	clientset "k8s.io/client-go/kubernetes"
)

// Every node enforces NetworkPolicy for its own pods (internal/netpol), as the node: it
// must read every pod (a policy's peers are pods anywhere in the cluster), the namespaces
// and the policies. The Node authorizer lets a node list only its own pods, so RBAC grants
// the group system:nodes this read, and nothing else. The role is made again on every start,
// so a store made before it existed, or one whose owner changed it, gets it back.
const (
	nodeNetworkPolicyHook = "socialweb/node-network-policy-reader"
	nodeNetworkPolicyRole = "socialweb:node-network-policy-reader"
)

func nodeNetworkPolicyRules() []rbacv1.PolicyRule {
	read := []string{"get", "list", "watch"}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: read},
	}
}

func ensureNodeNetworkPolicyReader(hc genericapiserver.PostStartHookContext) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: nodeNetworkPolicyRole}, Rules: nodeNetworkPolicyRules()}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: nodeNetworkPolicyRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: nodeNetworkPolicyRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: user.NodesGroup}},
	}
	return pollNow(hc, "grant nodes the read NetworkPolicy needs", func(ctx context.Context, client clientset.Interface) (bool, error) {
		roles := client.RbacV1().ClusterRoles()
		if _, err := roles.Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			cur, err := roles.Get(ctx, role.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			cur.Rules = role.Rules
			if _, err := roles.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return false, nil
			}
		} else if err != nil {
			return false, nil
		}
		bindings := client.RbacV1().ClusterRoleBindings()
		if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
			cur, err := bindings.Get(ctx, binding.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if cur.RoleRef != binding.RoleRef {
				// The role a binding names cannot change: make it again.
				if err := bindings.Delete(ctx, cur.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					return false, nil
				}
				return false, nil
			}
			cur.Subjects = binding.Subjects
			if _, err := bindings.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
				return false, nil
			}
		} else if err != nil {
			return false, nil
		}
		return true, nil
	})
}
