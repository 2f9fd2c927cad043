package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
)

// Config says where and how the core runs.
type Config struct {
	// Dir holds etcd, the PKI, the admin token and the kubeconfig; see OpenDataDir. The core
	// owns it from Start on and releases it in Stop.
	Dir *DataDir
	// Listen is the HTTPS address of the API server; "127.0.0.1:0" picks a free port.
	Listen string
	// CRDs are installed (created or updated) before Start returns.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// WatchCache turns the API server's watch cache on. Off by default: at the size of one
	// machine, reading etcd directly costs less memory and start-up time than a cache.
	WatchCache bool
	Logger     *slog.Logger
}

// Core is a running embedded control plane.
type Core struct {
	dir        *DataDir
	closeEtcd  func() // etcd, and the socket's directory when it is named through it
	storeSize  func() int64
	cancel     context.CancelFunc
	serverDone chan error
	stopOnce   sync.Once

	// URL is the API server's https URL.
	URL string
	// KubeconfigPath is where the admin kubeconfig was written.
	KubeconfigPath string
	// RESTConfig reaches the API server as admin, unthrottled.
	RESTConfig *rest.Config
}

// PortInUseError is returned when the listen address is taken.
type PortInUseError struct{ Addr string }

func (e *PortInUseError) Error() string {
	return fmt.Sprintf("cannot listen on %s: address already in use (pick another with --listen)", e.Addr)
}

// Start opens the data dir, starts etcd and the API server, installs the CRDs, waits until
// they serve, and writes the kubeconfig. On any error everything started is stopped again.
func Start(ctx context.Context, cfg Config) (_ *Core, err error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	dir := cfg.Dir
	c := &Core{dir: dir, serverDone: make(chan error, 1)}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, &PortInUseError{Addr: cfg.Listen}
		}
		return nil, fmt.Errorf("cannot listen on %s: %w", cfg.Listen, err)
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	ips := []net.IP{net.ParseIP("127.0.0.1")}
	if ip := net.ParseIP(host); ip != nil && !ip.Equal(ips[0]) && !ip.IsUnspecified() {
		ips = append(ips, ip)
	}
	pk, err := ensurePKI(dir.PKI(), ips)
	if err != nil {
		ln.Close()
		return nil, err
	}
	token, err := ensureSecretFile(dir.AdminToken(), 32)
	if err != nil {
		ln.Close()
		return nil, err
	}
	if err := writeEncryptionConfig(dir.EncryptionKey()); err != nil {
		ln.Close()
		return nil, err
	}

	t0 := time.Now()
	etcdURL, closeEtcd, storeSize, err := startEtcd(ctx, dir)
	if err != nil {
		ln.Close()
		return nil, err
	}
	c.closeEtcd, c.storeSize = closeEtcd, storeSize
	log.Debug("etcd ready", "took", time.Since(t0))

	server, err := newAPIServer(apiServerParams{
		etcdURL: etcdURL, listener: ln, pki: pk, adminToken: token,
		encryption: dir.EncryptionKey(), watchCache: cfg.WatchCache,
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("API server: %w", err)
	}
	prepared := server.GenericAPIServer.PrepareRun()
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() { c.serverDone <- prepared.RunWithContext(runCtx) }()

	_, port, _ := net.SplitHostPort(ln.Addr().String())
	c.URL = "https://" + net.JoinHostPort(ips[0].String(), port)
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		c.URL = "https://" + ln.Addr().String()
	}
	c.RESTConfig = restConfig(c.URL, pk.CAPEM, token)
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	log.Debug("API server ready", "took", time.Since(t0))
	if err := InstallCRDs(ctx, c.RESTConfig, cfg.CRDs); err != nil {
		return nil, err
	}
	log.Debug("CRDs serving", "took", time.Since(t0))
	if err := migrateLegacySecrets(ctx, c.RESTConfig, log); err != nil {
		return nil, err
	}
	c.KubeconfigPath = dir.Kubeconfig()
	if err := writeKubeconfig(c.KubeconfigPath, c.URL, pk.CAPEM, token); err != nil {
		return nil, fmt.Errorf("writing kubeconfig: %w", err)
	}
	return c, nil
}

func (c *Core) waitReady(ctx context.Context) error {
	client, err := rest.HTTPClientFor(c.RESTConfig)
	if err != nil {
		return err
	}
	get := func(ctx context.Context, path string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+c.RESTConfig.BearerToken)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	errc := make(chan error, 1)
	go func() { errc <- waitReady(ctx, get, 60*time.Second) }()
	select {
	case err := <-errc:
		return err
	case err := <-c.serverDone:
		c.serverDone <- err
		return fmt.Errorf("API server exited: %v", err)
	}
}

// DataDir is the core's data directory.
func (c *Core) DataDir() *DataDir { return c.dir }

// StoreUse is the size of the store's database and its quota (StoreQuotaBytes).
func (c *Core) StoreUse() (size, quota int64) { return c.storeSize(), StoreQuotaBytes }

// Done delivers the API server's exit error if it stops on its own.
func (c *Core) Done() <-chan error { return c.serverDone }

// Stop stops the API server, then etcd, then releases the data dir. It is safe to call
// more than once.
func (c *Core) Stop() {
	c.stopOnce.Do(func() {
		if c.cancel != nil {
			c.cancel()
			select {
			case <-c.serverDone:
			case <-time.After(30 * time.Second):
			}
		}
		if c.closeEtcd != nil {
			c.closeEtcd()
		}
		c.dir.Close()
	})
}
