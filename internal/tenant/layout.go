package tenant

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"socialweb.computer/internal/clusternet"
)

// Layout is a tenant cluster's directory under the tenants root:
//
//	<root>/<namespace>/<name>/
//	  pki/           CA, serving and client pairs, service-account keys
//	  etcd/          the store; kept while the cluster is stopped, removed when it is deleted
//	  kubeconfigs/   for the controller-manager and the scheduler
//	  spec.json      what the child process runs
//	  admission.yaml the Pod Security level the apiserver enforces
//	  ports.json     the leased loopback ports (apiserver, gate), kept so addresses survive restarts
//	  revoked-nodes.json the released node names, whose credentials are refused
//	  controlplane.pid, controlplane.log, etcd.log
type Layout struct{ Dir string }

// LayoutFor is the directory of the cluster namespace/name under root.
func LayoutFor(root, namespace, name string) Layout {
	return Layout{Dir: filepath.Join(root, namespace, name)}
}

func (l Layout) PKI() string         { return filepath.Join(l.Dir, "pki") }
func (l Layout) Etcd() string        { return filepath.Join(l.Dir, "etcd") }
func (l Layout) EtcdSocket() string  { return filepath.Join(l.Dir, "etcd.sock") }
func (l Layout) Kubeconfigs() string { return filepath.Join(l.Dir, "kubeconfigs") }
func (l Layout) Spec() string        { return filepath.Join(l.Dir, "spec.json") }
func (l Layout) Ports() string       { return filepath.Join(l.Dir, "ports.json") }
func (l Layout) PIDFile() string     { return filepath.Join(l.Dir, "controlplane.pid") }
func (l Layout) Log() string         { return filepath.Join(l.Dir, "controlplane.log") }
func (l Layout) AuditPolicy() string { return filepath.Join(l.Dir, "audit-policy.yaml") }
func (l Layout) AuditLog() string    { return filepath.Join(l.Dir, "audit.log") }
func (l Layout) Revocations() string { return filepath.Join(l.Dir, "revocations.json") }

// RevokedNodes are the cluster's released node names (noderevocation.go).
func (l Layout) RevokedNodes() string { return filepath.Join(l.Dir, "revoked-nodes.json") }

// AdmissionConfig is the apiserver's admission configuration (the Pod Security level).
func (l Layout) AdmissionConfig() string { return filepath.Join(l.Dir, "admission.yaml") }

// ServiceCIDR is every tenant cluster's service network; its first address is the
// kubernetes service's cluster IP and is in the serving certificate.
const ServiceCIDR = clusternet.ServiceCIDR

// firstServiceIP is the kubernetes service's cluster IP in ServiceCIDR.
func firstServiceIP() net.IP {
	_, n, _ := net.ParseCIDR(ServiceCIDR)
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1)
}

// ServingDNSNames are the names in the serving certificate (only the in-cluster names: no
// name is ever resolved on the host).
var ServingDNSNames = []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}

// disabledControllers are the kube-controller-manager controllers a cluster whose nodes come
// and go on demand does not need: storage-version and resource-claim machinery, and the
// alpha/beta publishers. Each costs informers, so memory. ResourceQuota, the
// HorizontalPodAutoscaler (the Metrics API is served), EndpointSlice mirroring, generic
// ephemeral volumes and the VolumeAttributesClass protection (its finalizer is how a class
// in use is kept; without the controller a deleted class never goes) run: they are
// Kubernetes a tenant's workloads and the conformance suite expect.
var disabledControllers = []string{
	"ttl-controller",
	"bootstrap-signer-controller",
	"token-cleaner-controller",
	"storageversion-garbage-collector-controller",
	"storage-version-migrator-controller",
	"resourceclaim-controller",
	"resourcepoolstatusrequest-controller",
	"device-taint-eviction-controller",
	"selinux-warning-controller",
	"validatingadmissionpolicy-status-controller",
	"kube-apiserver-serving-clustertrustbundle-publisher-controller",
	"podcertificaterequest-cleaner-controller",
	"persistentvolume-expander-controller",
}

// BuildSpec is the child's spec for a cluster in layout l serving on 127.0.0.1:port and
// advertising advertise (a non-loopback address: the apiserver refuses loopback for the
// kubernetes service's endpoints).
//
// rev is the cluster's revocation state at now: the retired service-account keys still in
// their window verify (pods' tokens only, by the policy), and the policy goes to the child.
// currentKeyID is the kid of the current signing key (sa.pub).
func BuildSpec(l Layout, p *PKI, port int, advertise net.IP, rev Revocations, currentKeyID string, now time.Time) ChildSpec {
	kc := func(n string) string { return filepath.Join(l.Kubeconfigs(), n+".kubeconfig") }
	_, saPub := serviceAccountKeyFiles(p.Dir)
	var verify []string
	for _, f := range rev.VerificationKeyFiles(saPub, now) {
		verify = append(verify, "--service-account-key-file="+f)
	}
	api := []string{
		"--etcd-servers=unix://" + l.EtcdSocket(),
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=" + advertise.String(),
		"--client-ca-file=" + p.Cert("ca"),
		"--tls-cert-file=" + p.Cert("apiserver"),
		"--tls-private-key-file=" + p.Key("apiserver"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-signing-key-file=" + filepath.Join(p.Dir, "sa.key"),
		// Every token lives at most MaxTokenLifetime (the kubelet's default request of
		// 3607 s is shortened to it, and not extended to a year): a retired key verifies
		// nothing once that has passed after its rotation (revocation.go).
		"--service-account-max-token-expiration=" + MaxTokenLifetime.String(),
		"--service-account-extend-token-expiration=false",
		// Who created ServiceAccounts, tokens and bindings, for revocation (audit.go).
		"--audit-policy-file=" + l.AuditPolicy(),
		"--audit-log-path=" + l.AuditLog(),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
		// Rotated files (audit-<time>.log) are all kept and all read: the log is the only
		// record of who made what.
		"--audit-log-maxsize=100",
		"--audit-log-maxbackup=0",
		"--audit-log-maxage=0",
		"--service-cluster-ip-range=" + ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		// Pod Security: the level in admission.yaml is enforced on every pod, by PodSecurity
		// for namespaces without labels and by the floor plugin for all of them; no
		// container is ever privileged. A tenant's pod runs on a provider's machine.
		"--enable-admission-plugins=NodeRestriction,PodSecurity," + FloorPluginName,
		"--admission-control-config-file=" + l.AdmissionConfig(),
		"--allow-privileged=false",
		// The aggregation layer: aggregated API servers (tenants' pods) authenticate the
		// apiserver's proxied requests by this CA and take the user from the headers (pki.go).
		"--requestheader-client-ca-file=" + p.Cert("front-proxy-ca"),
		"--requestheader-allowed-names=" + FrontProxyClientName,
		"--requestheader-username-headers=X-Remote-User",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file=" + p.Cert("front-proxy-client"),
		"--proxy-client-key-file=" + p.Key("front-proxy-client"),
		"--kubelet-client-certificate=" + p.Cert("apiserver-kubelet-client"),
		"--kubelet-client-key=" + p.Key("apiserver-kubelet-client"),
		// Never a name: the node proxy resolves a Hostname address through the host's
		// resolver (its proxyable-address check) before it dials.
		"--kubelet-preferred-address-types=InternalIP",
		// What it sends into the cluster (kubelets, webhooks, aggregated APIs, the pod and
		// Service proxy) goes through the nodes' tunnels, never from the host (egress.go).
		"--egress-selector-config-file=" + l.EgressSelectorConfig(),
		// Without a client certificate the answer is the apiserver's own 401.
		"--anonymous-auth=false",
		// Trimmed for an idle cluster: no profiling endpoints, no priority-and-fairness
		// machinery (one owner, a handful of clients), no watch cache (reads go to etcd,
		// which for a cluster this size is cheap and saves a copy of every object).
		"--profiling=false",
		"--enable-priority-and-fairness=false",
		// The flowcontrol.apiserver.k8s.io API is still served: Kubernetes clients and the
		// conformance suite expect FlowSchemas and PriorityLevelConfigurations to be there,
		// though nothing here classifies requests by them. Their defaults are written by a
		// hook of ours, in parallel (kube/hooks.go; the cost in docs/tenant.md).
		"--watch-cache=false",
		"--event-ttl=1h",
	}
	api = append(api, verify...)
	common := func(name string) []string {
		return []string{
			"--kubeconfig=" + kc(name),
			// No serving port: several clusters on one host would collide on the defaults,
			// and nothing scrapes them.
			"--secure-port=0",
			// One instance per cluster: leader election only writes leases.
			"--leader-elect=false",
			"--profiling=false",
		}
	}
	cm := append(common("controller-manager"),
		"--service-account-private-key-file="+filepath.Join(p.Dir, "sa.key"),
		"--root-ca-file="+p.Cert("ca"),
		"--use-service-account-credentials=false",
		"--cluster-signing-cert-file="+p.Cert("ca"),
		"--cluster-signing-key-file="+p.Key("ca"),
		// Certificates it signs (a kubelet renewing its client certificate) live as long
		// as a node's join bundle, not the default year.
		"--cluster-signing-duration="+NodeBundleTTL.String(),
		"--controllers=*,-"+strings.Join(disabledControllers, ",-"),
		// Its default is a host path (/usr/libexec/kubernetes/...), which it creates.
		"--flex-volume-plugin-dir="+filepath.Join(l.Dir, "flexvolume"),
		// Node IPAM: each Node gets its own /24 of the pod network (spec.podCIDR); the
		// node's network process writes its CNI config with it and routes the other nodes'
		// through the overlay (docs/networking.md).
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+clusternet.ClusterCIDR,
		fmt.Sprintf("--node-cidr-mask-size=%d", clusternet.NodeCIDRMaskSize),
		"--service-cluster-ip-range="+ServiceCIDR,
	)
	sched := common("scheduler")
	return ChildSpec{
		EtcdDir:           l.Etcd(),
		EtcdSocket:        l.EtcdSocket(),
		EtcdLog:           filepath.Join(l.Dir, "etcd.log"),
		APIServer:         api,
		ControllerManager: cm,
		Scheduler:         sched,
		ReadyzURL:         fmt.Sprintf("https://127.0.0.1:%d/readyz", port),
		CAFile:            p.Cert("ca"),
		ClientCert:        p.Cert("admin"),
		ClientKey:         p.Key("admin"),
		IdleAfter:         "5s",
		IdleGCPercent:     25,
		// The apiserver's start allocates mostly garbage (OpenAPI documents, REST
		// handlers): collecting it a quarter as often cuts its CPU by ~0.3 s.
		APIServerStartGCPercent: 400,
		TokenPolicy:             rev.Policy(currentKeyID, now),
		RevokedNodesFile:        l.RevokedNodes(),
	}
}
