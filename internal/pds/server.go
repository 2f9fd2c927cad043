package pds

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/lexicon"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/serviceauth"
)

// Config configures a Server. Only DataDir is required.
type Config struct {
	// DataDir holds pds.db (accounts, repos, firehose, and the in-process PLC directory).
	DataDir string
	// Addr is the listen address; default 127.0.0.1:0.
	Addr string
	// Hostname is the public host name of the service; default the host of PublicURL, else
	// "localhost". With PublicURL set it must be that URL's host.
	Hostname string
	// PublicURL is the URL written into DID documents (ParsePublicURL says which are taken);
	// default http://<listen address>.
	PublicURL string
	// Relays are relays' base URLs (ParseRelayURL) asked to crawl this PDS
	// (com.atproto.sync.requestCrawl with the PublicURL's host) at start and after new
	// accounts; they need PublicURL.
	Relays []string
	// CrawlInterval is the least time between two requestCrawl to one relay; default 1 min.
	CrawlInterval time.Duration
	// PLCURL is an external did:plc directory. When empty, the server runs its own directory
	// in-process (stored in pds.db) and serves it on PLCAddr.
	PLCURL string
	// PLCAddr is where the in-process directory listens; default 127.0.0.1:0.
	PLCAddr string
	// ServiceDID is the server's own DID (the aud of session tokens); default did:web:<Hostname>.
	ServiceDID string
	// UserDomains are the handle suffixes accounts may take; default [".test"].
	UserDomains []string
	// Lexicons are the project's lexicons, resolved before the embedded standard set
	// (internal/pds/stdlex: app.bsky, chat.bsky, com.atproto, ... as the reference PDS
	// validates them). Records of a record type either knows are validated ("valid"); others
	// are stored as "unknown" unless the write asks for validation (validate.go).
	Lexicons lexicon.Catalog
	// SubscriberBuffer is how many frames a firehose consumer may fall behind before it gets
	// a ConsumerTooSlow error frame and is dropped; default 2048. Writers never wait on it.
	SubscriberBuffer int
	// OpenSignup lets createAccount over XRPC go without an invite code. Start refuses it
	// unless Addr is a loopback address: an open PDS on a reachable address is anyone's.
	OpenSignup bool
	// AdminPassword is the password of HTTP Basic user "admin" on the admin methods
	// (createInviteCode, createInviteCodes). Empty: nobody is admin over XRPC; in-process
	// callers mint codes with CreateInviteCode.
	AdminPassword string
	// LoginLimits bound createSession attempts; zero fields take DefaultLoginLimits.
	LoginLimits LoginLimits
	// BlobStore holds blob bytes; default a DiskBlobStore in <DataDir>/blobs.
	BlobStore BlobStore
	// BlobUploadLimit is the largest blob uploadBlob takes, in bytes; default
	// DefaultBlobUploadLimit (5 MiB, as the reference PDS).
	BlobUploadLimit int64
	// ImportLimit is the largest CAR importRepo takes, in bytes; default DefaultImportLimit.
	ImportLimit int64
	// BlobGrace is how long a blob no record references is kept; default DefaultBlobGrace.
	BlobGrace time.Duration
	// BlobSweepInterval is how often the sweep runs; default DefaultBlobSweepInterval,
	// negative: never in the background (SweepBlobs may still be called).
	BlobSweepInterval time.Duration
	// Clock, when set, is the time blob grace periods are measured by; default time.Now.
	Clock func() time.Time
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// OpenSignupError is OpenSignup asked of a PDS that listens, or is published, beyond loopback.
type OpenSignupError struct{ Addr string }

func (e *OpenSignupError) Error() string {
	return fmt.Sprintf("open sign-up needs a loopback listen address and public URL, not %s: bind 127.0.0.1 (or ::1), or require invite codes (createInviteCode with the admin password)", e.Addr)
}

// isLoopbackAddr says whether a listen address only accepts loopback connections. A host
// name is not resolved: only literal loopback IPs and "localhost" count.
func isLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// plcDirectory is what the server needs from a did:plc directory, in-process or remote.
type plcDirectory interface {
	Submit(ctx context.Context, did string, op *plc.Op) error
	Last(ctx context.Context, did string) (*plc.Op, error)
	Data(ctx context.Context, did string) (*plc.Data, error)
}

// Server is a running PDS.
type Server struct {
	cfg Config
	lex lexicon.Catalog // cfg.Lexicons over the standard set
	log *slog.Logger
	db  *bolt.DB

	jwtSecret   []byte
	rotationKey *atcrypto.PrivateKeyK256
	tidClock    *syntax.TIDClock

	plc      plcDirectory
	plcLocal *plc.Directory
	plcURL   string
	dir      identity.Directory
	svcAuth  *serviceauth.Verifier
	logins   *loginLimiter
	blobs    BlobStore
	now      func() time.Time
	// blobMu orders uploads' make-permanent steps against the sweep's deletions.
	blobMu sync.Mutex
	bg     sync.WaitGroup

	acctMu  sync.Mutex
	reposMu sync.Mutex
	repos   map[string]*repoState
	seqMu   sync.Mutex
	hub     hub
	// crawl asks relays to crawl this PDS; nil without relays.
	crawl     *crawler
	stopCrawl context.CancelFunc

	url       string
	localURL  string
	listeners []net.Listener
	servers   []*http.Server
	closeOnce sync.Once
}

// New opens (or creates) the server's data under cfg.DataDir. Call Start to serve.
func New(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("pds: DataDir is required")
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.PLCAddr == "" {
		cfg.PLCAddr = "127.0.0.1:0"
	}
	if cfg.SubscriberBuffer <= 0 {
		cfg.SubscriberBuffer = defaultSubscriberBuffer
	}
	var public PublicURL
	if cfg.PublicURL != "" {
		var err error
		if public, err = ParsePublicURL(cfg.PublicURL); err != nil {
			return nil, err
		}
		cfg.PublicURL = public.String()
		switch {
		case cfg.Hostname == "":
			cfg.Hostname = public.Host
		case !strings.EqualFold(cfg.Hostname, public.Host):
			return nil, &PublicURLError{URL: cfg.PublicURL, Reason: fmt.Sprintf("its host is not the hostname %q; give one of them, or the same host in both", cfg.Hostname)}
		}
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "localhost"
	}
	cfg.Relays = append([]string(nil), cfg.Relays...)
	for i, r := range cfg.Relays {
		u, err := ParseRelayURL(r)
		if err != nil {
			return nil, err
		}
		if cfg.PublicURL == "" {
			return nil, &RelayURLError{URL: r, Reason: "a relay crawls a PDS by its public host name, and none is set: give the public URL (https://<host name>) too"}
		}
		cfg.Relays[i] = u
	}
	if cfg.CrawlInterval <= 0 {
		cfg.CrawlInterval = defaultCrawlPolicy.MinInterval
	}
	if cfg.ServiceDID == "" {
		cfg.ServiceDID = "did:web:" + cfg.Hostname
	}
	if len(cfg.UserDomains) == 0 {
		cfg.UserDomains = []string{".test"}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OpenSignup && !isLoopbackAddr(cfg.Addr) {
		return nil, &OpenSignupError{Addr: cfg.Addr}
	}
	// A loopback listener behind a proxy is reachable from wherever the proxy is.
	if u, err := url.Parse(cfg.PublicURL); cfg.OpenSignup && cfg.PublicURL != "" && (err != nil || !isLoopbackAddr(net.JoinHostPort(u.Hostname(), "0"))) {
		return nil, &OpenSignupError{Addr: cfg.PublicURL}
	}
	cfg.LoginLimits = cfg.LoginLimits.withDefaults()
	if cfg.BlobUploadLimit <= 0 {
		cfg.BlobUploadLimit = DefaultBlobUploadLimit
	}
	if cfg.ImportLimit <= 0 {
		cfg.ImportLimit = DefaultImportLimit
	}
	if cfg.BlobGrace <= 0 {
		cfg.BlobGrace = DefaultBlobGrace
	}
	if cfg.BlobSweepInterval == 0 {
		cfg.BlobSweepInterval = DefaultBlobSweepInterval
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	db, err := bolt.Open(filepath.Join(cfg.DataDir, "pds.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("pds: open database: %w", err)
	}
	lex, err := catalogFor(cfg.Lexicons)
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Server{cfg: cfg, lex: lex, log: cfg.Logger.With("component", "pds"), db: db, repos: map[string]*repoState{}, logins: newLoginLimiter(cfg.LoginLimits),
		tidClock: syntax.NewTIDClock(0), hub: hub{buffer: cfg.SubscriberBuffer, subs: map[*subscriber]struct{}{}, closed: make(chan struct{})},
		blobs: cfg.BlobStore, now: cfg.Clock}
	if len(cfg.Relays) > 0 {
		p := defaultCrawlPolicy
		p.MinInterval = cfg.CrawlInterval
		s.crawl = newCrawler(public.CrawlHostname(), cfg.Relays, p, s.log)
	}
	if s.blobs == nil {
		ds, err := NewDiskBlobStore(filepath.Join(cfg.DataDir, "blobs"))
		if err != nil {
			db.Close()
			return nil, err
		}
		s.blobs = ds
	}
	if err := s.initMeta(); err != nil {
		db.Close()
		return nil, err
	}
	if cfg.PLCURL == "" {
		d, err := plc.NewWithDB(db)
		if err != nil {
			db.Close()
			return nil, err
		}
		s.plcLocal, s.plc = d, d
	} else {
		s.plc = &plc.Client{URL: cfg.PLCURL}
		s.plcURL = cfg.PLCURL
	}
	return s, nil
}

func (s *Server) initMeta() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		m := tx.Bucket(bMeta)
		if v := m.Get([]byte("jwtSecret")); v != nil {
			s.jwtSecret = append([]byte(nil), v...)
		} else {
			s.jwtSecret = make([]byte, 32)
			if _, err := rand.Read(s.jwtSecret); err != nil {
				return err
			}
			if err := m.Put([]byte("jwtSecret"), s.jwtSecret); err != nil {
				return err
			}
		}
		if v := m.Get([]byte("rotationKey")); v != nil {
			k, err := atcrypto.ParsePrivateBytesK256(v)
			if err != nil {
				return err
			}
			s.rotationKey = k
		} else {
			k, err := atcrypto.GeneratePrivateKeyK256()
			if err != nil {
				return err
			}
			s.rotationKey = k
			if err := m.Put([]byte("rotationKey"), k.Bytes()); err != nil {
				return err
			}
		}
		s.hub.last = lastSeq(tx)
		return nil
	})
}

// Start listens on cfg.Addr (and the in-process PLC directory on cfg.PLCAddr) and serves until
// Close. When the public URL differs from the one the accounts' DID documents name (a new
// port after a restart), it updates their documents through the PLC directory.
func (s *Server) Start(ctx context.Context) error {
	if s.plcLocal != nil {
		ln, err := net.Listen("tcp", s.cfg.PLCAddr)
		if err != nil {
			return fmt.Errorf("pds: plc listen: %w", err)
		}
		s.plcURL = "http://" + ln.Addr().String()
		s.serve(ln, s.plcLocal.Handler())
	}
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		s.Close()
		return fmt.Errorf("pds: listen: %w", err)
	}
	s.localURL = "http://" + ln.Addr().String()
	s.url = s.cfg.PublicURL
	if s.url == "" {
		s.url = s.localURL
	}
	s.dir = &identity.BaseDirectory{PLCURL: s.plcURL, SkipHandleVerification: true,
		HTTPClient: http.Client{Timeout: 10 * time.Second}}
	s.svcAuth = serviceauth.New(serviceauth.Config{Directory: serviceauth.CachingDirectory(s.dir), Audiences: []string{s.cfg.ServiceDID}})
	if err := s.reconcileEndpoints(ctx); err != nil {
		s.Close()
		return err
	}
	s.serve(ln, s.routes())
	if s.cfg.BlobSweepInterval > 0 {
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			s.runBlobSweep(s.cfg.BlobSweepInterval)
		}()
	}
	if s.crawl != nil {
		// Not ctx: that may be only the start-up's; the loops end with Close.
		crawlCtx, cancel := context.WithCancel(context.Background())
		s.stopCrawl = cancel
		s.bg.Add(len(s.crawl.relays))
		s.crawl.run(crawlCtx, s.bg.Done)
	}
	s.log.Info("pds listening", "url", s.url, "plc", s.plcURL)
	return nil
}

func (s *Server) serve(ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	s.listeners = append(s.listeners, ln)
	s.servers = append(s.servers, srv)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "err", err)
		}
	}()
}

// URL is the PDS's base URL, e.g. http://127.0.0.1:41234.
func (s *Server) URL() string { return s.url }

// LocalURL is the address the PDS listens on, http://<listen address>; the same as URL
// unless a public URL is set (then a proxy in front of it serves that one).
func (s *Server) LocalURL() string { return s.localURL }

// PLCURL is the did:plc directory the server registers DIDs with.
func (s *Server) PLCURL() string { return s.plcURL }

// ServiceDID is the server's own DID.
func (s *Server) ServiceDID() string { return s.cfg.ServiceDID }

// Directory resolves DIDs through the server's PLC directory.
func (s *Server) Directory() identity.Directory { return s.dir }

// Close stops serving and closes the database.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		// End every subscription first: firehose connections are hijacked and would
		// outlive Shutdown, leaving consumers attached to a server that is gone.
		close(s.hub.closed)
		if s.stopCrawl != nil {
			s.stopCrawl()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, srv := range s.servers {
			_ = srv.Shutdown(ctx)
		}
		for _, srv := range s.servers {
			_ = srv.Close()
		}
		s.bg.Wait()
		err = s.db.Close()
	})
	return err
}

// reconcileEndpoints points each account's #atproto_pds service at the current URL, for the
// accounts whose DID document is this server's to change: it names the account's signing key
// here and keeps the server's rotation key. An account that moved to another PDS, or is moving
// here and not yet named by its document, is left alone: rewriting its document would take
// the identity from the PDS that holds it (or be refused by the directory).
func (s *Server) reconcileEndpoints(ctx context.Context) error {
	rotPub, err := s.rotationKey.PublicKey()
	if err != nil {
		return err
	}
	var accts []account
	err = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bAccounts).ForEach(func(_, v []byte) error {
			a, err := decodeAccount(v)
			if err == nil {
				accts = append(accts, *a)
			}
			return err
		})
	})
	if err != nil {
		return err
	}
	for _, a := range accts {
		last, err := s.plc.Last(ctx, a.DID)
		if errors.Is(err, plc.ErrNotFound) {
			return fmt.Errorf("pds: the did:plc directory %s does not know account %s (%s): its accounts were registered with another directory; start it with that one (--plc-url, or none for the in-process one): %w", s.plcURL, a.Handle, a.DID, err)
		}
		if err != nil {
			return fmt.Errorf("pds: reading PLC log of %s: %w", a.DID, err)
		}
		if svc, ok := last.Services["atproto_pds"]; ok && svc.Endpoint == s.url {
			continue
		}
		sig, err := signingDIDKey(&a)
		if err != nil {
			return err
		}
		if last.VerificationMethods["atproto"] != sig || !slices.Contains(last.RotationKeys, rotPub.DIDKey()) {
			s.log.Info("DID document names another PDS's keys: endpoint left as it is", "did", a.DID)
			continue
		}
		next := plc.Op{RotationKeys: last.RotationKeys, VerificationMethods: last.VerificationMethods,
			AlsoKnownAs: last.AlsoKnownAs, Services: map[string]plc.Service{}}
		for k, v := range last.Services {
			next.Services[k] = v
		}
		next.Services["atproto_pds"] = plc.Service{Type: "AtprotoPersonalDataServer", Endpoint: s.url}
		op, err := plc.Next(s.rotationKey, last, next)
		if err != nil {
			return err
		}
		if err := s.plc.Submit(ctx, a.DID, op); err != nil {
			return fmt.Errorf("pds: updating PDS endpoint of %s: %w", a.DID, err)
		}
		if err := s.emitIdentity(a.DID, a.Handle); err != nil {
			return err
		}
		s.log.Info("pds endpoint updated", "did", a.DID, "endpoint", s.url)
	}
	return nil
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.TrimSuffix(h, ".")
}
