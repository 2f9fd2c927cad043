package tenant

// ChildSpec is what the control-plane child process (`socialweb kube controlplane --spec
// FILE`) runs: an etcd member on a unix socket, then kube-apiserver, then, once the
// apiserver's /readyz answers 200, kube-controller-manager and kube-scheduler, each with the
// arguments given here. The parent writes it as JSON into the cluster's directory; keeping the
// flag lists on this side keeps them testable without building Kubernetes.
type ChildSpec struct {
	EtcdDir    string `json:"etcdDir"`
	EtcdSocket string `json:"etcdSocket"`
	EtcdLog    string `json:"etcdLog"`

	APIServer         []string `json:"apiserver"`
	ControllerManager []string `json:"controllerManager"`
	Scheduler         []string `json:"scheduler"`

	// ReadyzURL is polled with the admin client certificate before the controller-manager
	// starts: it exits when the apiserver cannot yet serve its authentication config.
	ReadyzURL  string `json:"readyzURL"`
	CAFile     string `json:"caFile"`
	ClientCert string `json:"clientCert"`
	ClientKey  string `json:"clientKey"`

	// Once the controllers have started and IdleAfter has passed, the child lowers its Go
	// heap target to IdleGCPercent and IdleMemoryLimit (bytes) and returns freed memory to
	// the OS: a start at the default GOGC is twice as fast as one under a tight limit, and
	// an idle control plane needs far less than its start did.
	IdleAfter string `json:"idleAfter,omitempty"`
	// APIServerStartGCPercent, when set, is the Go heap target (GOGC) while the apiserver
	// starts, until /readyz answers; the previous target applies again before the
	// controllers start.
	APIServerStartGCPercent int   `json:"apiserverStartGCPercent,omitempty"`
	IdleGCPercent           int   `json:"idleGCPercent,omitempty"`
	IdleMemoryLimit         int64 `json:"idleMemoryLimit,omitempty"`

	// TokenPolicy is checked after the apiserver verified a token: revoked credentials and
	// tokens of retired service-account keys are refused (revocation.go).
	TokenPolicy TokenPolicy `json:"tokenPolicy,omitempty"`

	// RevokedNodesFile holds the cluster's released node names: every credential naming one
	// is refused at authentication. The apiserver reads it again whenever it changes
	// (noderevocation.go).
	RevokedNodesFile string `json:"revokedNodesFile,omitempty"`
}
