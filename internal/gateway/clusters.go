package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/tenant"
)

// AccountNamespace is the namespace of an account's objects in the core:
// acct-<the first 16 hex digits of sha256(DID)> (a DID is not a valid namespace name).
func AccountNamespace(did string) string {
	h := sha256.Sum256([]byte(did))
	return "acct-" + hex.EncodeToString(h[:])[:16]
}

// Kubeconfig lifetimes getKubeconfig accepts, in seconds.
const (
	MinTTLSeconds = 60
	MaxTTLSeconds = 86400
)

func (s *Server) clusterMethods() map[string]method {
	proc := func(f func(ctx context.Context, account string, in []byte) (any, error)) method {
		return method{procedure: true, call: func(ctx context.Context, account string, in []byte, _ url.Values) (any, error) {
			return f(ctx, account, in)
		}}
	}
	return map[string]method{
		cluster.CreateClusterNSID:    proc(s.createCluster),
		cluster.GetKubeconfigNSID:    proc(s.getKubeconfig),
		cluster.ControlPlaneUpNSID:   proc(s.controlPlaneUp),
		cluster.ControlPlaneDownNSID: proc(s.controlPlaneDown),
		cluster.DeleteClusterNSID:    proc(s.deleteCluster),
		cluster.SetPublishInfraNSID:  proc(s.setPublishInfra),
		cluster.RevokeIdentityNSID:   proc(s.revokeIdentity),
		cluster.ListClustersNSID:     {call: s.listClusters},
	}
}

// nameInput decodes {name} and checks it is a DNS-1123 label.
func nameInput(in []byte) (string, error) {
	var v struct {
		Name *string `json:"name"`
	}
	if err := decodeInput(in, &v); err != nil {
		return "", err
	}
	if v.Name == nil {
		return "", invalidRequest("name is required")
	}
	return *v.Name, checkName(*v.Name)
}

func checkName(name string) error {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return invalidRequest("name %q is not a DNS-1123 label: %s", name, errs[0])
	}
	return nil
}

// lookup returns the caller's cluster name. A cluster of another account and no cluster at
// all give the same ClusterNotFound.
func (s *Server) lookup(ctx context.Context, account, name string) (*v1alpha1.Cluster, error) {
	var c v1alpha1.Cluster
	err := s.cfg.Client.Get(ctx, client.ObjectKey{Namespace: AccountNamespace(account), Name: name}, &c)
	if apierrors.IsNotFound(err) || (err == nil && c.Spec.Account != account) {
		return nil, notFound(name)
	}
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// phaseOf is the phase to report: Draining once deleted, else the observed phase, else (never
// reconciled yet) what the desired state leads to.
func phaseOf(c *v1alpha1.Cluster) string {
	switch {
	case !c.DeletionTimestamp.IsZero():
		return string(v1alpha1.ClusterDraining)
	case c.Status.Phase != "":
		return string(c.Status.Phase)
	case c.Spec.Running:
		return string(v1alpha1.ClusterInitializing)
	}
	return string(v1alpha1.ClusterUnavailable)
}

// setRunning writes the desired state and returns the phase it leads to.
func (s *Server) setRunning(ctx context.Context, c *v1alpha1.Cluster, running bool) (string, error) {
	if !c.DeletionTimestamp.IsZero() {
		if running {
			return "", notReady("cluster %q is being deleted", c.Spec.Name)
		}
		return string(v1alpha1.ClusterDraining), nil
	}
	if c.Spec.Running != running {
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec.Running = running
		if err := s.cfg.Client.Patch(ctx, c, patch); err != nil {
			if apierrors.IsNotFound(err) {
				return "", notFound(c.Spec.Name)
			}
			return "", err
		}
	}
	switch {
	case running && c.Status.Phase == v1alpha1.ClusterReady:
		return string(v1alpha1.ClusterReady), nil
	case running && c.Status.Phase == v1alpha1.ClusterSleeping:
		// Up means serving: a connection to the asleep gate is what wakes it.
		if err := wake(c.Status.Server); err != nil {
			return "", notReady("cluster %q is asleep and its gate does not answer: %v", c.Spec.Name, err)
		}
		return string(v1alpha1.ClusterInitializing), nil
	case running:
		return string(v1alpha1.ClusterInitializing), nil
	}
	return string(v1alpha1.ClusterUnavailable), nil
}

func (s *Server) createCluster(ctx context.Context, account string, in []byte) (any, error) {
	name, err := nameInput(in)
	if err != nil {
		return nil, err
	}
	c, err := s.lookup(ctx, account, name)
	var xe *Error
	if errors.As(err, &xe) && xe.Name == ErrClusterNotFound {
		s.createMu.Lock()
		defer s.createMu.Unlock()
		if err := s.checkClusterQuota(ctx, account); err != nil {
			return nil, err
		}
		c = &v1alpha1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: AccountNamespace(account), Name: name},
			Spec:       v1alpha1.ClusterSpec{Account: account, Name: name, Running: true},
		}
		err = s.cfg.Client.Create(ctx, c)
		if err == nil {
			return cluster.CreateClusterOutput{Phase: string(v1alpha1.ClusterInitializing)}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
		// Created concurrently: carry on with the stored one.
		c, err = s.lookup(ctx, account, name)
	}
	if err != nil {
		return nil, err
	}
	phase, err := s.setRunning(ctx, c, true)
	if err != nil {
		return nil, err
	}
	return cluster.CreateClusterOutput{Phase: phase}, nil
}

// checkClusterQuota refuses a new cluster to an account that holds its quota of clusters
// already (one being deleted counts until it is gone: its control plane and nodes are still
// there).
func (s *Server) checkClusterQuota(ctx context.Context, account string) error {
	if s.cfg.Quota.Clusters <= 0 {
		return nil
	}
	var list v1alpha1.ClusterList
	if err := s.cfg.Client.List(ctx, &list, client.InNamespace(AccountNamespace(account))); err != nil {
		return err
	}
	used := 0
	for i := range list.Items {
		if list.Items[i].Spec.Account == account {
			used++
		}
	}
	if e := quota.CheckClusters(s.cfg.Quota, account, used); e != nil {
		return quotaExceeded(e, "delete one with deleteCluster, or ask the operator to raise --quota-clusters")
	}
	return nil
}

func (s *Server) controlPlane(ctx context.Context, account string, in []byte, running bool) (string, error) {
	name, err := nameInput(in)
	if err != nil {
		return "", err
	}
	c, err := s.lookup(ctx, account, name)
	if err != nil {
		return "", err
	}
	return s.setRunning(ctx, c, running)
}

func (s *Server) controlPlaneUp(ctx context.Context, account string, in []byte) (any, error) {
	phase, err := s.controlPlane(ctx, account, in, true)
	if err != nil {
		return nil, err
	}
	return cluster.ControlPlaneUpOutput{Phase: phase}, nil
}

func (s *Server) controlPlaneDown(ctx context.Context, account string, in []byte) (any, error) {
	phase, err := s.controlPlane(ctx, account, in, false)
	if err != nil {
		return nil, err
	}
	return cluster.ControlPlaneDownOutput{Phase: phase}, nil
}

// deleteCluster deletes the object and returns at once: the Cluster controller's finalizer
// does the teardown, and the phase is Draining from now on.
func (s *Server) deleteCluster(ctx context.Context, account string, in []byte) (any, error) {
	name, err := nameInput(in)
	if err != nil {
		return nil, err
	}
	c, err := s.lookup(ctx, account, name)
	if err != nil {
		return nil, err
	}
	if c.DeletionTimestamp.IsZero() {
		// Preconditions: delete exactly the object that was checked to be the caller's.
		err := s.cfg.Client.Delete(ctx, c, client.Preconditions{UID: &c.UID})
		if apierrors.IsNotFound(err) {
			return nil, notFound(name)
		}
		if err != nil {
			return nil, err
		}
	}
	return cluster.DeleteClusterOutput{Phase: string(v1alpha1.ClusterDraining)}, nil
}

func (s *Server) getKubeconfig(ctx context.Context, account string, in []byte) (any, error) {
	var v cluster.GetKubeconfigInput
	if err := decodeInput(in, &v); err != nil {
		return nil, err
	}
	if err := checkName(v.Name); err != nil {
		return nil, err
	}
	noExpiry := v.NoExpiry != nil && *v.NoExpiry
	ttl := int64(cluster.GetKubeconfigInputTTLSecondsDefault)
	if v.TTLSeconds != nil {
		if noExpiry {
			return nil, xrpcErr(http.StatusBadRequest, ErrBadExpiration, "ttlSeconds and noExpiry are exclusive")
		}
		ttl = *v.TTLSeconds
		if ttl < MinTTLSeconds || ttl > MaxTTLSeconds {
			return nil, invalidRequest("ttlSeconds %d is outside %d..%d", ttl, MinTTLSeconds, MaxTTLSeconds)
		}
	}
	c, err := s.lookup(ctx, account, v.Name)
	if err != nil {
		return nil, err
	}
	if !c.DeletionTimestamp.IsZero() {
		return nil, notReady("cluster %q is being deleted", v.Name)
	}
	if err := revoked(c, account); err != nil {
		return nil, err
	}
	if c.Status.Server == "" {
		return nil, notReady("cluster %q has not started yet (phase %s)", v.Name, phaseOf(c))
	}
	k := tenant.Key{Namespace: c.Namespace, Name: c.Name}
	var kc []byte
	if noExpiry {
		kc, _, err = tenant.MintKubeconfigNoExpiry(s.cfg.TenantsRoot, k, account, c.Status.Server)
	} else {
		kc, _, err = tenant.MintKubeconfig(s.cfg.TenantsRoot, k, account, c.Status.Server, time.Duration(ttl)*time.Second)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notReady("cluster %q has no certificate authority yet", v.Name)
	}
	if err != nil {
		return nil, err
	}
	out := cluster.GetKubeconfigOutput{Kubeconfig: string(kc)}
	if c.Status.Instance != "" {
		out.Instance = &c.Status.Instance
	}
	return out, nil
}

func (s *Server) listClusters(ctx context.Context, account string, _ []byte, _ url.Values) (any, error) {
	var list v1alpha1.ClusterList
	if err := s.cfg.Client.List(ctx, &list, client.InNamespace(AccountNamespace(account))); err != nil {
		return nil, err
	}
	out := cluster.ListClustersOutput{Clusters: []cluster.ListClustersClusterView{}}
	for i := range list.Items {
		c := &list.Items[i]
		if c.Spec.Account != account {
			continue
		}
		running, blocked := c.Spec.Running, c.Status.TeardownBlocked != ""
		v := cluster.ListClustersClusterView{Name: c.Name, Phase: phaseOf(c), Running: &running, TeardownBlocked: &blocked}
		if c.Status.Instance != "" {
			v.Instance = &c.Status.Instance
		}
		if c.Status.Server != "" {
			v.Server = &c.Status.Server
		}
		out.Clusters = append(out.Clusters, v)
	}
	sort.Slice(out.Clusters, func(i, j int) bool { return out.Clusters[i].Name < out.Clusters[j].Name })
	return out, nil
}

// setPublishInfra sets spec.publishInfra: whether the cluster's node deployments are published
// as records in the owner's repo. It answers its input.
func (s *Server) setPublishInfra(ctx context.Context, account string, in []byte) (any, error) {
	var v struct {
		Name    string `json:"name"`
		Publish *bool  `json:"publish"`
	}
	if err := decodeInput(in, &v); err != nil {
		return nil, err
	}
	if err := checkName(v.Name); err != nil {
		return nil, err
	}
	if v.Publish == nil {
		return nil, invalidRequest("publish is required")
	}
	c, err := s.lookup(ctx, account, v.Name)
	if err != nil {
		return nil, err
	}
	if !c.DeletionTimestamp.IsZero() {
		return nil, notReady("cluster %q is being deleted", v.Name)
	}
	if c.Spec.PublishInfra != *v.Publish {
		patch := client.MergeFrom(c.DeepCopy())
		c.Spec.PublishInfra = *v.Publish
		if err := s.cfg.Client.Patch(ctx, c, patch); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, notFound(v.Name)
			}
			return nil, err
		}
	}
	return cluster.SetPublishInfraOutput{Name: v.Name, Publish: *v.Publish}, nil
}

// wake opens (and closes) a connection to an asleep cluster's gate (server is its https
// URL): the gate asks for a wake on the first connection of a sleep.
func wake(server string) error {
	u, err := url.Parse(server)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}
