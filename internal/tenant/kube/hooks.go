package kube

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	flowcontrolbootstrap "k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/auth/rbac/reconciliation"
	"k8s.io/klog/v2"
	schedulingapiv1 "k8s.io/kubernetes/pkg/apis/scheduling/v1"
	flowcontrolrest "k8s.io/kubernetes/pkg/registry/flowcontrol/rest"
	rbacrest "k8s.io/kubernetes/pkg/registry/rbac/rest"
	schedulingrest "k8s.io/kubernetes/pkg/registry/scheduling/rest"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"
)

// The apiserver's own hooks that bootstrap the system priority classes and the default RBAC
// policy (scheduling/bootstrap-system-priority-classes, rbac/bootstrap-roles) both wait a
// full second before their first attempt (wait.Poll), and /readyz waits for them: a second
// of every start spent sleeping. The control plane disables them and registers these, which
// do the same work but try at once and retry every 100 ms.
const (
	priorityClassesHook = "socialweb/bootstrap-system-priority-classes"
	rbacPolicyHook      = "socialweb/bootstrap-roles"
	// The default namespace's ServiceAccount "default", which the controller-manager's
	// service account controller would make (and then finds there): pods in the default
	// namespace are refused until it exists, and on a new cluster the controller-manager,
	// started after /readyz, gets to it a few hundred milliseconds later, competing with
	// its own start for the CPU. Made by the apiserver, /readyz includes it.
	defaultServiceAccountHook = "socialweb/default-service-account"
	// A kubelet renews its client certificate with a CertificateSigningRequest for its own
	// name; the controller-manager approves such a request when the node may create
	// certificatesigningrequests/selfnodeclient, which this binding grants every node.
	nodeClientRenewalHook    = "socialweb/node-client-certificate-renewal"
	nodeClientRenewalBinding = "socialweb:node-client-certificate-renewal"
	selfNodeClientRole       = "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"
	// The flowcontrol.apiserver.k8s.io defaults (the mandatory and suggested FlowSchemas and
	// PriorityLevelConfigurations). Upstream's priority-and-fairness-config-producer writes
	// them one after another before /readyz and re-checks them every minute; with priority
	// and fairness off nothing reads them, so this one creates the missing ones in parallel
	// at each start and never re-checks.
	flowControlHook = "socialweb/bootstrap-flowcontrol"
	hookRetry       = 100 * time.Millisecond
	hookTimeout     = 30 * time.Second
	rbacParallel    = 8
)

// replaceBootstrapHooks disables the upstream hooks in cfg; addBootstrapHooks adds the
// replacements to the server (rbac false: the store already holds this version's policy).
func replaceBootstrapHooks(disabled sets.Set[string]) {
	disabled.Insert(schedulingrest.PostStartHookName, rbacrest.PostStartHookName, flowcontrolrest.PostStartHookName)
}

func addBootstrapHooks(s *genericapiserver.GenericAPIServer, rbac bool) error {
	if err := s.AddPostStartHook(priorityClassesHook, ensurePriorityClasses); err != nil {
		return err
	}
	if err := s.AddPostStartHook(defaultServiceAccountHook, ensureDefaultServiceAccount); err != nil {
		return err
	}
	if err := s.AddPostStartHook(nodeClientRenewalHook, ensureNodeClientRenewal); err != nil {
		return err
	}
	if err := s.AddPostStartHook(flowControlHook, ensureFlowControlDefaults); err != nil {
		return err
	}
	if err := s.AddPostStartHook(localPathHook, ensureLocalPathStorage); err != nil {
		return err
	}
	if err := s.AddPostStartHook(nodeNetworkPolicyHook, ensureNodeNetworkPolicyReader); err != nil {
		return err
	}
	if rbac {
		return s.AddPostStartHook(rbacPolicyHook, ensureRBACPolicy)
	}
	return nil
}

// pollNow calls fn at once and then every hookRetry until it is done or hookTimeout passes.
func pollNow(hc genericapiserver.PostStartHookContext, what string, fn func(context.Context, clientset.Interface) (bool, error)) error {
	return pollEvery(hc, hookRetry, what, fn)
}

func pollEvery(hc genericapiserver.PostStartHookContext, every time.Duration, what string, fn func(context.Context, clientset.Interface) (bool, error)) error {
	err := wait.PollUntilContextTimeout(hc, every, hookTimeout, true, func(ctx context.Context) (bool, error) {
		client, err := clientset.NewForConfig(hc.LoopbackClientConfig)
		if err != nil {
			utilruntime.HandleError(fmt.Errorf("unable to initialize client: %v", err))
			return false, nil
		}
		return fn(ctx, client)
	})
	if err != nil {
		return fmt.Errorf("unable to %s: %v", what, err)
	}
	return nil
}

// ensurePriorityClasses is the scheduling/bootstrap-system-priority-classes hook
// (k8s.io/kubernetes/pkg/registry/scheduling/rest.AddSystemPriorityClasses) without its
// initial wait.
func ensurePriorityClasses(hc genericapiserver.PostStartHookContext) error {
	return pollNow(hc, "add default system priority classes", func(ctx context.Context, client clientset.Interface) (bool, error) {
		pcs := client.SchedulingV1().PriorityClasses()
		for _, pc := range schedulingapiv1.SystemPriorityClasses() {
			_, err := pcs.Get(ctx, pc.Name, metav1.GetOptions{})
			if err == nil {
				continue
			}
			if !apierrors.IsNotFound(err) {
				klog.Warningf("unable to get PriorityClass %v: %v. Retrying...", pc.Name, err)
				return false, nil
			}
			_, err = pcs.Create(ctx, pc, metav1.CreateOptions{})
			switch {
			case err == nil || apierrors.IsAlreadyExists(err):
				klog.Infof("created PriorityClass %s with value %v", pc.Name, pc.Value)
			case apierrors.IsServiceUnavailable(err):
				klog.Infof("going to retry, unable to create PriorityClass %s: %v", pc.Name, err)
				return false, nil
			default:
				return false, err
			}
		}
		klog.Infof("all system priority classes are created successfully or already exist.")
		return true, nil
	})
}

// ensureRBACPolicy is the rbac/bootstrap-roles hook
// (k8s.io/kubernetes/pkg/registry/rbac/rest.PolicyData.EnsureRBACPolicy) without its
// initial wait: it creates or reconciles the default cluster roles, cluster role bindings,
// namespaced roles and role bindings. It leaves out the upstream hook's migrations of roles
// and bindings that older Kubernetes versions stored under other names: a tenant store was
// created by this version.
func ensureRBACPolicy(hc genericapiserver.PostStartHookContext) error {
	clusterRoles := append(bootstrappolicy.ClusterRoles(), bootstrappolicy.ControllerRoles()...)
	clusterRoleBindings := append(bootstrappolicy.ClusterRoleBindings(), bootstrappolicy.ControllerRoleBindings()...)
	roles, roleBindings := bootstrappolicy.NamespaceRoles(), bootstrappolicy.NamespaceRoleBindings()
	return pollNow(hc, "initialize roles", func(ctx context.Context, client clientset.Interface) (bool, error) {
		// Make sure the store answers before reconciling.
		if _, err := client.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			utilruntime.HandleError(fmt.Errorf("unable to initialize clusterroles: %v", err))
			return false, nil
		}
		// The objects are independent: reconciled a few at a time, the store's writes
		// overlap instead of waiting for each other.
		var failed atomic.Bool
		var wg sync.WaitGroup
		slots := make(chan struct{}, rbacParallel)
		reconcile := func(kind, name string, run func() error) {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				// ServiceUnavailable is returned while storage versions are being updated.
				err := retry.OnError(retry.DefaultBackoff, func(err error) bool {
					return apierrors.IsConflict(err) || apierrors.IsServiceUnavailable(err)
				}, run)
				if err != nil {
					// Keep going: create as many as possible, then retry.
					utilruntime.HandleError(fmt.Errorf("unable to reconcile %s %s: %v", kind, name, err))
					failed.Store(true)
				}
			}()
		}
		report := func(kind, name string, protected bool, op reconciliation.ReconcileOperation, missing any) {
			switch {
			case protected && op != reconciliation.ReconcileNone:
				klog.Warningf("skipped reconcile-protected %s %s, missing: %v", kind, name, missing)
			case op != reconciliation.ReconcileNone:
				klog.V(2).Infof("%s %s: %s", op, kind, name)
			}
		}
		for i := range clusterRoles {
			r := &clusterRoles[i]
			reconcile("clusterrole", r.Name, func() error {
				o := reconciliation.ReconcileRoleOptions{
					Role:    reconciliation.ClusterRoleRuleOwner{ClusterRole: r},
					Client:  reconciliation.ClusterRoleModifier{Client: client.RbacV1().ClusterRoles()},
					Confirm: true,
				}
				res, err := o.Run()
				if err == nil {
					report("clusterrole", r.Name, res.Protected, res.Operation, res.MissingRules)
				}
				return err
			})
		}
		for i := range clusterRoleBindings {
			b := &clusterRoleBindings[i]
			reconcile("clusterrolebinding", b.Name, func() error {
				o := reconciliation.ReconcileRoleBindingOptions{
					RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: b},
					Client:      reconciliation.ClusterRoleBindingClientAdapter{Client: client.RbacV1().ClusterRoleBindings()},
					Confirm:     true,
				}
				res, err := o.Run()
				if err == nil {
					report("clusterrolebinding", b.Name, res.Protected, res.Operation, res.MissingSubjects)
				}
				return err
			})
		}
		for ns, rs := range roles {
			for i := range rs {
				r := &rs[i]
				reconcile("role", ns+"/"+r.Name, func() error {
					o := reconciliation.ReconcileRoleOptions{
						Role:    reconciliation.RoleRuleOwner{Role: r},
						Client:  reconciliation.RoleModifier{Client: client.RbacV1(), NamespaceClient: client.CoreV1().Namespaces()},
						Confirm: true,
					}
					res, err := o.Run()
					if err == nil {
						report("role", ns+"/"+r.Name, res.Protected, res.Operation, res.MissingRules)
					}
					return err
				})
			}
		}
		for ns, bs := range roleBindings {
			for i := range bs {
				b := &bs[i]
				reconcile("rolebinding", ns+"/"+b.Name, func() error {
					o := reconciliation.ReconcileRoleBindingOptions{
						RoleBinding: reconciliation.RoleBindingAdapter{RoleBinding: b},
						Client:      reconciliation.RoleBindingClientAdapter{Client: client.RbacV1(), NamespaceClient: client.CoreV1().Namespaces()},
						Confirm:     true,
					}
					res, err := o.Run()
					if err == nil {
						report("rolebinding", ns+"/"+b.Name, res.Protected, res.Operation, res.MissingSubjects)
					}
					return err
				})
			}
		}
		wg.Wait()
		return !failed.Load(), nil
	})
}

// ensureDefaultServiceAccount creates the default namespace's ServiceAccount "default",
// retrying every 10 ms while the namespace is not there yet (the apiserver's bootstrap
// controller creates it).
func ensureDefaultServiceAccount(hc genericapiserver.PostStartHookContext) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: metav1.NamespaceDefault}}
	return pollEvery(hc, 10*time.Millisecond, "create the default service account", func(ctx context.Context, client clientset.Interface) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(sa.Namespace).Create(ctx, sa, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
}

// ensureNodeClientRenewal binds every node to the role whose holders' renewals of their own
// client certificate the controller-manager approves. It runs on every start (one create),
// so a store made before the binding existed gets it too.
func ensureNodeClientRenewal(hc genericapiserver.PostStartHookContext) error {
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: nodeClientRenewalBinding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: selfNodeClientRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: user.NodesGroup}},
	}
	return pollNow(hc, "bind nodes to renew their client certificates", func(ctx context.Context, client clientset.Interface) (bool, error) {
		_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
}

// ensureFlowControlDefaults creates the mandatory and suggested FlowSchemas and
// PriorityLevelConfigurations that are missing, rbacParallel at a time. It leaves existing
// ones as they are (upstream's hook updates them to this version's spec: a tenant store is
// created by this version, and an owner's edits stay), and does not come back every minute:
// with priority and fairness off no request is classified by them.
func ensureFlowControlDefaults(hc genericapiserver.PostStartHookContext) error {
	var plcs []*flowcontrolv1.PriorityLevelConfiguration
	plcs = append(plcs, flowcontrolbootstrap.MandatoryPriorityLevelConfigurations...)
	plcs = append(plcs, flowcontrolbootstrap.SuggestedPriorityLevelConfigurations...)
	var fss []*flowcontrolv1.FlowSchema
	fss = append(fss, flowcontrolbootstrap.MandatoryFlowSchemas...)
	fss = append(fss, flowcontrolbootstrap.SuggestedFlowSchemas...)
	return pollNow(hc, "create the flowcontrol defaults", func(ctx context.Context, client clientset.Interface) (bool, error) {
		fc := client.FlowcontrolV1()
		var creates []func() error
		for _, o := range plcs {
			creates = append(creates, func() error {
				_, err := fc.PriorityLevelConfigurations().Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		}
		for _, o := range fss {
			creates = append(creates, func() error {
				_, err := fc.FlowSchemas().Create(ctx, o, metav1.CreateOptions{})
				return err
			})
		}
		var wg sync.WaitGroup
		var failed atomic.Int32
		slots := make(chan struct{}, rbacParallel)
		for _, create := range creates {
			wg.Add(1)
			slots <- struct{}{}
			go func() {
				defer func() { <-slots; wg.Done() }()
				if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
					klog.Infof("going to retry the flowcontrol defaults: %v", err)
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
		return failed.Load() == 0, nil
	})
}
