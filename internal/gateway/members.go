package gateway

import (
	"context"
	"net/http"
	"sort"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/tenant"
)

// Members: the owner of a cluster is its one implicit member (Granted); spec.members records
// what was decided beyond that. revokeIdentity writes the deny record (the DID's entry
// Revoked) first, then removes the DID's ServiceAccount and bindings from the tenant
// cluster; the entry stays, Revoked. Every method that acts in the cluster (getKubeconfig,
// kubectlApplyServerSide, getJob) refuses a revoked caller with Forbidden before it reads or
// writes anything there.

// revoked refuses a caller the cluster's spec.members denies.
func revoked(c *v1alpha1.Cluster, account string) error {
	if st, ok := c.Spec.MemberStateOf(account); ok && st == v1alpha1.MemberRevoked {
		return xrpcErr(http.StatusForbidden, ErrForbidden, "identity %s is revoked in cluster %q", account, c.Spec.Name)
	}
	return nil
}

// adminConfig is a rest.Config for the cluster's gate as the cluster's admin (no
// impersonation): only revokeIdentity uses it, to remove an identity.
func (s *Server) adminConfig(c *v1alpha1.Cluster) *rest.Config {
	p := &tenant.PKI{Dir: tenant.LayoutFor(s.cfg.TenantsRoot, c.Namespace, c.Name).PKI()}
	return &rest.Config{
		Host:            c.Status.Server,
		TLSClientConfig: rest.TLSClientConfig{CAFile: p.Cert("ca"), CertFile: p.Cert("admin"), KeyFile: p.Key("admin")},
		QPS:             20, Burst: 40, Timeout: 30 * time.Second,
	}
}

// revokeIdentity revokes did's access to the caller's cluster name: the deny record first
// (spec.members: did Revoked, kept), then, when the cluster is Ready, the DID's ServiceAccount
// and bindings go from the tenant cluster. A cluster that is not running gets them removed by
// the Cluster controller at its next start; a removal that fails here is done by the Cluster
// controller too (it applies every change of spec.members), while the deny record already
// keeps the gateway from acting for the DID. A DID that is no member is InvalidRequest; one
// already revoked answers the same again.
func (s *Server) revokeIdentity(ctx context.Context, account string, in []byte) (any, error) {
	var v cluster.RevokeIdentityInput
	if err := decodeInput(in, &v); err != nil {
		return nil, err
	}
	if err := checkName(v.Name); err != nil {
		return nil, err
	}
	if _, err := syntax.ParseDID(v.DID); err != nil {
		return nil, invalidRequest("did %q is not a DID: %v", v.DID, err)
	}
	var c *v1alpha1.Cluster
	for try := 0; ; try++ {
		var err error
		if c, err = s.lookup(ctx, account, v.Name); err != nil {
			return nil, err
		}
		if !c.DeletionTimestamp.IsZero() {
			return nil, notReady("cluster %q is being deleted", v.Name)
		}
		st, ok := c.Spec.MemberStateOf(v.DID)
		if !ok {
			return nil, invalidRequest("%s is not a member of cluster %q", v.DID, v.Name)
		}
		if st == v1alpha1.MemberRevoked {
			break
		}
		patch := client.MergeFromWithOptions(c.DeepCopy(), client.MergeFromWithOptimisticLock{})
		c.Spec.Members = setMember(c.Spec.Members, v1alpha1.ClusterMember{Did: v.DID, State: v1alpha1.MemberRevoked, RevokedAt: ptr(metav1.Now())})
		err = s.cfg.Client.Patch(ctx, c, patch)
		if err == nil {
			s.log.Info("gateway_identity_revoked", "cluster", c.Namespace+"/"+c.Name, "did", v.DID)
			break
		}
		switch {
		case apierrors.IsNotFound(err):
			return nil, notFound(v.Name)
		case apierrors.IsConflict(err) && try < 5:
			continue
		}
		return nil, err
	}
	if c.Status.Phase == v1alpha1.ClusterReady && c.Status.Server != "" {
		// What the DID made in the cluster (ServiceAccounts, bindings) goes too; the
		// audit log that says so is in the cluster's directory, beside its PKI.
		made, err := tenant.AttributionFor(tenant.LayoutFor(s.cfg.TenantsRoot, c.Namespace, c.Name), v.DID)
		var cs kubernetes.Interface
		if err == nil {
			cs, err = kubernetes.NewForConfig(s.adminConfig(c))
		}
		if err == nil {
			_, err = tenant.RevokeIdentity(ctx, cs, v.DID, made)
		}
		if err != nil {
			s.log.Warn("gateway_revoke_tenant_failed", "cluster", c.Namespace+"/"+c.Name, "did", v.DID, "error", err)
		}
	}
	name := "serviceaccount/" + tenant.OwnerNamespace + "/" + tenant.OwnerServiceAccount(v.DID)
	return cluster.RevokeIdentityOutput{Revoked: []cluster.RevokeIdentityRevoked{
		{Name: name, State: cluster.RevokeIdentityRevokedStateRevoked}}}, nil
}

// setMember replaces (or appends) m's entry.
func setMember(ms []v1alpha1.ClusterMember, m v1alpha1.ClusterMember) []v1alpha1.ClusterMember {
	out := make([]v1alpha1.ClusterMember, 0, len(ms)+1)
	for _, x := range ms {
		if x.Did != m.Did {
			out = append(out, x)
		}
	}
	return append(out, m)
}

// membersOf is the cluster's members and their states: the owner (Granted unless revoked)
// and every spec.members entry.
func membersOf(c *v1alpha1.Cluster) map[string]string {
	out := map[string]string{}
	if st, ok := c.Spec.MemberStateOf(c.Spec.Account); ok {
		out[c.Spec.Account] = string(st)
	}
	for _, m := range c.Spec.Members {
		out[m.Did] = string(m.State)
	}
	return out
}

// memberFrames are the #member frames that take a subscriber from the members it was last
// shown (before) to now (nil: the cluster is gone), sorted by DID.
func memberFrames(name string, before, now map[string]string) []cluster.SubscribeClustersMember {
	var out []cluster.SubscribeClustersMember
	for did, st := range now {
		if before[did] != st {
			st := st
			out = append(out, cluster.SubscribeClustersMember{Cluster: name, DID: did, State: &st})
		}
	}
	for did, st := range before {
		if _, ok := now[did]; !ok {
			st, gone := st, true
			out = append(out, cluster.SubscribeClustersMember{Cluster: name, DID: did, State: &st, Deleted: &gone})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].DID < out[j].DID })
	return out
}
