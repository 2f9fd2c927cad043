package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/server/v3/embed"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	genericapiserver "k8s.io/apiserver/pkg/server"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeversion "k8s.io/component-base/version"
	"k8s.io/klog/v2"

	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	apiserveroptions "k8s.io/kubernetes/cmd/kube-apiserver/app/options"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	cmoptions "k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	scheduleroptions "k8s.io/kubernetes/cmd/kube-scheduler/app/options"

	"socialweb.computer/internal/etcdstore"
	"socialweb.computer/internal/tenant"
	"socialweb.computer/internal/unixsock"
)

// rbacPolicyMarker, in a cluster's directory, names the Kubernetes version whose default RBAC
// policy the cluster's store holds.
const rbacPolicyMarker = "rbac-policy-version"

// runAPIServer is kube-apiserver's app.Run with the bootstrap hooks of hooks.go in place of
// upstream's, the RBAC one left out when the stored policy is current, and the cluster's
// token policy and revoked nodes after its authenticators (revocation.go,
// noderevocation.go).
func runAPIServer(ctx context.Context, opts apiserveroptions.CompletedOptions, policyCurrent bool, tokens tenant.TokenPolicy, revokedNodes string, provisioner provisionerSecrets) error {
	config, err := apiserverapp.NewConfig(opts)
	if err != nil {
		return err
	}
	replaceBootstrapHooks(sets.Set[string](config.KubeAPIs.ControlPlane.Generic.DisabledPostStartHooks))
	applyTokenPolicy(config, tokens)
	applyRevokedNodes(ctx, config, revokedNodes)
	applyProvisionerAuth(config, provisioner)
	// The Metrics API's types in the OpenAPI documents (metrics.go); the configurations
	// may share one OpenAPI configuration, wrapped once.
	wrapped := map[any]bool{}
	for _, g := range []*genericapiserver.Config{config.KubeAPIs.ControlPlane.Generic, &config.ApiExtensions.GenericConfig.Config, &config.Aggregator.GenericConfig.Config} {
		if c := g.OpenAPIConfig; c != nil && !wrapped[c] {
			wrapped[c] = true
			c.GetDefinitions = withMetricsDefinitions(c.GetDefinitions)
		}
		if c := g.OpenAPIV3Config; c != nil && !wrapped[c] {
			wrapped[c] = true
			c.GetDefinitions = withMetricsDefinitions(c.GetDefinitions)
		}
	}
	completed, err := config.Complete()
	if err != nil {
		return err
	}
	server, err := apiserverapp.CreateServerChain(completed)
	if err != nil {
		return err
	}
	if err := addBootstrapHooks(server.GenericAPIServer, !policyCurrent); err != nil {
		return err
	}
	if err := installMetricsAPI(server.GenericAPIServer); err != nil {
		return err
	}
	prepared, err := server.PrepareRun()
	if err != nil {
		return err
	}
	return prepared.Run(ctx)
}

func newControlPlaneCommand() *cobra.Command {
	var specPath string
	cmd := &cobra.Command{
		Use:          "controlplane --spec FILE",
		Short:        "Run etcd, kube-apiserver, kube-controller-manager and kube-scheduler in this one process",
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := os.ReadFile(specPath)
			if err != nil {
				return err
			}
			var spec tenant.ChildSpec
			if err := json.Unmarshal(b, &spec); err != nil {
				return fmt.Errorf("%s: %w", specPath, err)
			}
			return runControlPlane(spec)
		},
	}
	cmd.Flags().StringVar(&specPath, "spec", "", "the control plane's spec (JSON, written by the Cluster controller)")
	_ = cmd.MarkFlagRequired("spec")
	return cmd
}

// runControlPlane runs the four components in one process (about half the memory of four
// processes: one Go runtime, one copy of the code and of the shared caches). It owns the
// process's signals: on SIGTERM or SIGINT it stops the controllers, then the apiserver, then
// etcd, in that order (an apiserver whose store went first hangs on shutdown).
func runControlPlane(spec tenant.ChildSpec) error {
	// Three components apply the same logging configuration in one process.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)

	phase("entered")
	// SOCIALWEB_TENANT_CPU_PROFILE=FILE profiles the start (its first 10 s); PID in FILE
	// becomes the process id, so that several starts keep their profiles apart.
	if f := os.Getenv("SOCIALWEB_TENANT_CPU_PROFILE"); f != "" {
		f = strings.ReplaceAll(f, "PID", strconv.Itoa(os.Getpid()))
		if out, err := os.Create(f); err == nil && pprof.StartCPUProfile(out) == nil {
			go func() {
				time.Sleep(10 * time.Second)
				pprof.StopCPUProfile()
				out.Close()
			}()
		}
	}

	restoreGC := func() {}
	if spec.APIServerStartGCPercent > 0 {
		prev := debug.SetGCPercent(spec.APIServerStartGCPercent)
		restoreGC = func() { debug.SetGCPercent(prev) }
	}

	// A data dir deep enough makes the etcd socket's path longer than a unix socket address
	// may be; this process is the only one that binds and dials it, so it may name it
	// through its directory's descriptor.
	sock, closeDir, err := unixsock.Short(spec.EtcdSocket)
	if err != nil {
		return err
	}
	defer closeDir()
	if sock != spec.EtcdSocket {
		spec.APIServer = replaceArg(spec.APIServer, "--etcd-servers=unix://"+spec.EtcdSocket, "--etcd-servers=unix://"+sock)
		spec.EtcdSocket = sock
	}
	etcd, err := startEtcd(spec)
	if err != nil {
		return err
	}
	defer etcd.Close()
	phase("etcd ready")

	apiCtx, stopAPI := context.WithCancel(context.Background())
	defer stopAPI()
	ctrlCtx, stopCtrl := context.WithCancel(context.Background())
	defer stopCtrl()

	// The default RBAC policy is reconciled by a post-start hook on every start, which holds
	// /readyz back by about a second on a restart. A store this version already bootstrapped
	// holds the same policy, so a restart skips it (a new version reconciles again).
	policyMarker := filepath.Join(filepath.Dir(spec.EtcdDir), rbacPolicyMarker)
	policyCurrent := false
	if b, err := os.ReadFile(policyMarker); err == nil && string(b) == kubeversion.Get().GitVersion {
		policyCurrent = true
	}

	provisioner, err := newProvisionerSecrets()
	if err != nil {
		return err
	}
	apiDone := make(chan error, 1)
	if err := func() error {
		s := apiserveroptions.NewServerRunOptions()
		ga := s.Admission.GenericAdmission
		ga.RecommendedPluginOrder = registerFloor(ga.Plugins, ga.RecommendedPluginOrder, provisioner.proof)
		fg := s.GenericServerRunOptions.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
		nfs := s.Flags()
		if err := parse("kube-apiserver", nfs.FlagSets, spec.APIServer); err != nil {
			return err
		}
		if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
			return err
		}
		if err := logsapi.ValidateAndApply(s.Logs, fg); err != nil {
			return err
		}
		completed, err := s.Complete(apiCtx)
		if err != nil {
			return err
		}
		if errs := completed.Validate(); len(errs) != 0 {
			return utilerrors.NewAggregate(errs)
		}
		go func() {
			apiDone <- runAPIServer(apiCtx, completed, policyCurrent, spec.TokenPolicy, spec.RevokedNodesFile, provisioner)
		}()
		return nil
	}(); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}

	if err := waitReady(spec, apiDone, sigs); err != nil {
		return err
	}
	phase("apiserver ready")
	restoreGC()
	if !policyCurrent {
		if err := os.WriteFile(policyMarker, []byte(kubeversion.Get().GitVersion), 0o600); err != nil {
			klog.Warningf("recording the bootstrapped RBAC policy: %v", err)
		}
	}

	ctrlDone := make(chan error, 3)
	go func() {
		ctrlDone <- wrap("kube-controller-manager", runControllerManager(ctrlCtx, spec.ControllerManager))
	}()
	go func() { ctrlDone <- wrap("kube-scheduler", runScheduler(ctrlCtx, spec.Scheduler)) }()
	// The local-path provisioner: part of the control plane, so it serves with zero nodes
	// and runs nothing of the tenant's.
	go func() { ctrlDone <- wrap("local-path provisioner", runProvisioner(ctrlCtx, spec, provisioner)) }()

	if spec.IdleGCPercent > 0 || spec.IdleMemoryLimit > 0 {
		idleAfter, _ := time.ParseDuration(spec.IdleAfter)
		go func() {
			select {
			case <-time.After(idleAfter):
			case <-ctrlCtx.Done():
				return
			}
			n := settleIdle(spec.IdleGCPercent, spec.IdleMemoryLimit)
			klog.InfoS("settled for idle", "gcPercent", spec.IdleGCPercent, "memoryLimit", spec.IdleMemoryLimit, "pagedOutBytes", n)
			// SOCIALWEB_TENANT_HEAP_PROFILE=FILE writes a heap profile once idle (to see what
			// an idle control plane holds).
			if f := os.Getenv("SOCIALWEB_TENANT_HEAP_PROFILE"); f != "" {
				time.Sleep(10 * time.Second)
				if out, err := os.Create(f); err == nil {
					runtime.GC()
					_ = pprof.WriteHeapProfile(out)
					out.Close()
				}
			}
		}()
	}

	var runErr error
	select {
	case sig := <-sigs:
		klog.InfoS("stopping the control plane", "signal", sig.String())
	case err := <-apiDone:
		apiDone <- err
		runErr = fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-ctrlDone:
		runErr = err
	case err := <-etcd.Err():
		runErr = fmt.Errorf("etcd: %w", err)
	}
	stopCtrl()
	stopAPI()
	select {
	case <-apiDone:
	case <-time.After(20 * time.Second):
		klog.Warning("kube-apiserver did not stop within 20s")
	case <-sigs:
	}
	klog.Flush()
	return runErr
}

// phase logs how far the start has come: wall time since the process started and the CPU
// time it has used.
func phase(name string) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	klog.InfoS("control plane start", "phase", name, "wall", time.Since(processStart()).Round(time.Millisecond), "cpu", cpu.Round(time.Millisecond))
}

// processStart is when this process was started (from /proc/self/stat; now when unknown).
func processStart() time.Time {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return time.Now()
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	// starttime is field 22 of stat, the 20th after the command; in clock ticks since boot.
	if len(f) < 20 {
		return time.Now()
	}
	ticks, _ := strconv.ParseInt(f[19], 10, 64)
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Now()
	}
	secs, _ := strconv.ParseFloat(strings.Fields(string(up))[0], 64)
	ago := time.Duration(secs*float64(time.Second)) - time.Duration(ticks)*time.Second/100
	return time.Now().Add(-ago)
}

func wrap(name string, err error) error {
	if err == nil {
		err = errors.New("returned")
	}
	return fmt.Errorf("%s: %w", name, err)
}

func parse(name string, sets map[string]*pflag.FlagSet, args []string) error {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	for _, s := range sets {
		fs.AddFlagSet(s)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s flags: %w", name, err)
	}
	return nil
}

func runControllerManager(ctx context.Context, args []string) error {
	s, err := cmoptions.NewKubeControllerManagerOptions()
	if err != nil {
		return err
	}
	nfs := s.Flags(cmapp.KnownControllers(), cmapp.ControllersDisabledByDefault(), cmapp.ControllerAliases())
	s.ParsedFlags = &nfs
	if err := parse("kube-controller-manager", nfs.FlagSets, args); err != nil {
		return err
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(s.Logs, utilfeature.DefaultFeatureGate); err != nil {
		return err
	}
	c, err := s.Config(ctx, cmapp.KnownControllers(), cmapp.ControllersDisabledByDefault(), cmapp.ControllerAliases())
	if err != nil {
		return err
	}
	return cmapp.Run(ctx, c.Complete())
}

// runScheduler calls the scheduler's Setup and Run directly: its cobra command installs a
// second process-wide signal handler, which panics in a process that already has one.
func runScheduler(ctx context.Context, args []string) error {
	opts := scheduleroptions.NewOptions()
	if err := parse("kube-scheduler", opts.Flags.FlagSets, args); err != nil {
		return err
	}
	if err := opts.ComponentGlobalsRegistry.Set(); err != nil {
		return err
	}
	fg := opts.ComponentGlobalsRegistry.FeatureGateFor(basecompatibility.DefaultKubeComponent)
	if err := logsapi.ValidateAndApply(opts.Logs, fg); err != nil {
		return err
	}
	cc, sched, err := schedulerapp.Setup(ctx, opts)
	if err != nil {
		return err
	}
	return schedulerapp.Run(ctx, cc, sched)
}

// replaceArg is args with every arg equal to old replaced by new.
func replaceArg(args []string, old, new string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if a == old {
			out[i] = new
		}
	}
	return out
}

func startEtcd(spec tenant.ChildSpec) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = "tenant"
	cfg.Dir = spec.EtcdDir
	cfg.LogLevel = "error"
	if spec.EtcdLog != "" {
		cfg.LogOutputs = []string{spec.EtcdLog}
	}
	_ = os.Remove(spec.EtcdSocket)
	_ = os.Remove(spec.EtcdSocket + ".peer")
	client := url.URL{Scheme: "unix", Path: spec.EtcdSocket}
	peer := url.URL{Scheme: "unix", Path: spec.EtcdSocket + ".peer"}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	etcdstore.Configure(cfg)
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "10m"
	cfg.QuotaBackendBytes = 2 << 30
	return etcdstore.Start(context.Background(), cfg, 60*time.Second)
}

// waitReady polls the apiserver's /readyz with the admin certificate until it answers 200.
func waitReady(spec tenant.ChildSpec, apiDone chan error, sigs chan os.Signal) error {
	caPEM, err := os.ReadFile(spec.CAFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	crt, err := tls.LoadX509KeyPair(spec.ClientCert, spec.ClientKey)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{crt}},
	}}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := hc.Get(spec.ReadyzURL)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-apiDone:
			return fmt.Errorf("kube-apiserver stopped before it was ready: %v", err)
		case sig := <-sigs:
			return fmt.Errorf("stopped by %s before the apiserver was ready", sig)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready at %s within 2m", spec.ReadyzURL)
}
