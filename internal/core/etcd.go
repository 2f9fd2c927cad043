package core

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"socialweb.computer/internal/diskspace"
	"socialweb.computer/internal/etcdstore"
	"socialweb.computer/internal/unixsock"
)

// etcdMargin and a write-ahead log segment are the room a store needs to start: a new
// write-ahead log preallocates a segment (etcdstore.SegmentBytes), and the database and a
// snapshot need a little more. A store that has its log already needs only the margin
// until it rolls over to a new segment.
const etcdMargin = 16 * diskspace.MiB

// storeStopped ends the process when etcd gives up (its logger's Fatal, or Panic, which
// it uses for a write-ahead log it cannot write): one line on stderr naming the store's
// directory, what failed and the room left, and exit status 1, instead of a stack trace or
// an exit whose cause is only in etcd.log.
type storeStopped struct {
	dir string
	out io.Writer
}

func (h storeStopped) OnWrite(ce *zapcore.CheckedEntry, fields []zapcore.Field) {
	fmt.Fprintln(h.out, "socialweb: "+h.line(ce.Message, fields))
	os.Exit(1)
}

func (h storeStopped) line(msg string, fields []zapcore.Field) string {
	var b strings.Builder
	fmt.Fprintf(&b, "the store in %s stopped: %s", h.dir, msg)
	for _, f := range fields {
		if f.Type == zapcore.ErrorType {
			if err, ok := f.Interface.(error); ok {
				b.WriteString(": " + err.Error())
			}
		}
	}
	if r, err := diskspace.Of(h.dir); err == nil {
		fmt.Fprintf(&b, " (%s free on its file system)", diskspace.Human(r.Free))
	}
	return strings.ReplaceAll(b.String(), "\n", " ")
}

// etcdLogger is etcd's logger: errors to etcd.log, and storeStopped when it gives up.
func etcdLogger(dir, logFile string) (*zap.Logger, error) {
	c := logutil.DefaultZapLoggerConfig
	c.OutputPaths, c.ErrorOutputPaths = []string{logFile}, []string{logFile}
	c.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	hook := storeStopped{dir: dir, out: os.Stderr}
	return c.Build(zap.WithFatalHook(hook), zap.WithPanicHook(hook))
}

// startEtcd starts a single etcd member whose client endpoint is a unix socket in the data
// dir: no TCP port to race for or expose, and only this process can reach it. It returns the
// client URL, the func that closes etcd and the func that reads its database's size.
func startEtcd(ctx context.Context, d *DataDir) (clientURL string, closeEtcd func(), storeSize func() int64, err error) {
	cfg := embed.NewConfig()
	cfg.Name = "socialweb"
	cfg.Dir = d.Etcd()
	cfg.WalDir = ""
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(d.Logs(), "etcd.log")}
	room := uint64(etcdstore.SegmentBytes) + etcdMargin
	if wal.Exist(filepath.Join(cfg.Dir, "member", "wal")) {
		room = etcdMargin
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return "", nil, nil, fmt.Errorf("store: %w", err)
	}
	if err := diskspace.Require(cfg.Dir, room, "the store (etcd)"); err != nil {
		return "", nil, nil, err
	}
	lg, err := etcdLogger(cfg.Dir, cfg.LogOutputs[0])
	if err != nil {
		return "", nil, nil, fmt.Errorf("store log %s: %w", cfg.LogOutputs[0], err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// Only this process binds and dials it: under a deep data dir it is named through the
	// dir's descriptor, held open until etcd is closed (closeEtcd).
	sock, release, err := unixsock.Short(d.EtcdSocket())
	if err != nil {
		return "", nil, nil, err
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
	etcdstore.Configure(cfg)
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	cfg.QuotaBackendBytes = StoreQuotaBytes
	// Above the API server's body limit, so that limit is the one a client meets (limits.go).
	cfg.MaxRequestBytes = etcdMaxRequestBytes

	e, err := etcdstore.Start(ctx, cfg, 60*time.Second)
	if err != nil {
		release()
		return "", nil, nil, err
	}
	closeEtcd = func() { e.Close(); release() }
	return client.String(), closeEtcd, func() int64 { return e.Server.Backend().Size() }, nil
}

// StoreQuotaBytes is the store's space quota: past it etcd refuses every write (an alarm)
// until it is compacted and defragmented.
const StoreQuotaBytes = 8 << 30
