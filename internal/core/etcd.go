package core

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/server/v3/embed"

	"socialweb.computer/internal/unixsock"
)

// startEtcd starts a single etcd member whose client endpoint is a unix socket in the data
// dir: no TCP port to race for or expose, and only this process can reach it. It returns the
// client URL and the func that closes etcd.
func startEtcd(ctx context.Context, d *DataDir) (clientURL string, closeEtcd func(), err error) {
	cfg := embed.NewConfig()
	cfg.Name = "socialweb"
	cfg.Dir = d.Etcd()
	cfg.WalDir = ""
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(d.Logs(), "etcd.log")}
	// Only this process binds and dials it: under a deep data dir it is named through the
	// dir's descriptor, held open until etcd is closed (closeEtcd).
	sock, release, err := unixsock.Short(d.EtcdSocket())
	if err != nil {
		return "", nil, err
	}
	_ = os.Remove(sock)
	client := url.URL{Scheme: "unix", Path: sock}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	// One member never dials a peer, but etcd still wants a peer listener; a socket next to
	// the client one keeps it off the network as well.
	peer := url.URL{Scheme: "unix", Path: sock + ".peer"}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// One member has no one to wait for: short ticks make its first election (and so a
	// fresh start) take tens of milliseconds instead of a second.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	cfg.QuotaBackendBytes = 8 << 30
	// Above the API server's body limit, so that limit is the one a client meets (limits.go).
	cfg.MaxRequestBytes = etcdMaxRequestBytes

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		release()
		return "", nil, fmt.Errorf("starting etcd in %s: %w", cfg.Dir, err)
	}
	closeEtcd = func() { e.Close(); release() }
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		closeEtcd()
		return "", nil, fmt.Errorf("etcd: %w", err)
	case <-time.After(60 * time.Second):
		closeEtcd()
		return "", nil, fmt.Errorf("etcd in %s did not become ready within 60s (see %s)", cfg.Dir, cfg.LogOutputs[0])
	case <-ctx.Done():
		closeEtcd()
		return "", nil, ctx.Err()
	}
	return client.String(), closeEtcd, nil
}
