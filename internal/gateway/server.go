package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/internal/atproto/cluster"
	"socialweb.computer/internal/quota"
	"socialweb.computer/internal/serviceauth"
	"socialweb.computer/internal/xrpc"
)

// ServiceID is the fragment of the gateway's service entry in its DID document; a token's aud
// may name the DID alone or DID#ServiceID.
const ServiceID = "socialweb_gateway"

// maxBody bounds a procedure's JSON input.
const maxBody = 64 << 10

// Config configures a Server.
type Config struct {
	// Client reaches the core's API server (Cluster objects); subscribeClusters watches
	// through it.
	Client client.WithWatch
	// Directory resolves token issuers' DIDs. It should cache (identity.CacheDirectory) and
	// support Purge: a signature that fails against a cached key is checked once more
	// against a fresh lookup, so a rotated key is picked up.
	Directory identity.Directory
	// TenantsRoot is the tenant data directory (the cluster CAs kubeconfigs are minted from).
	TenantsRoot string
	// Addr to listen on; default 127.0.0.1:0.
	Addr string
	// PublicURL, when set, is the URL clients reach the gateway at, and its host names the
	// service DID; default http://<listen address>.
	PublicURL string
	// Audiences accepted besides the gateway's own DID (and DID#socialweb_gateway), e.g. a
	// public did:web the gateway also answers for.
	Audiences []string
	// Access is who the gateway serves: the DIDs of Access.Allow, or any DID with
	// Access.Open. The zero value serves no one.
	Access Access
	// WatchAccess adds what the GatewayAccess objects of namespace gateway admit to Access,
	// live (access_live.go).
	WatchAccess bool
	// Quota is what one account may hold; the gateway enforces Quota.Clusters at
	// createCluster (the node host enforces the node quotas). The zero value is no limit.
	Quota quota.Limits
	// RateLimit bounds calls per client address and per account; zero fields take the
	// defaults.
	RateLimit RateLimit
	// Now is the clock of token checks; default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Server is a running gateway.
type Server struct {
	cfg      Config
	ln       net.Listener
	srv      *http.Server
	url, did string
	auds     []string
	verifier *serviceauth.Verifier
	log      *slog.Logger
	methods  map[string]method

	access        atomic.Pointer[access]
	stopWatch     context.CancelFunc
	perIP, perDID *limiters
	// createMu makes createCluster's count and create one step, so concurrent creates of
	// one account cannot pass the clusters quota together.
	createMu sync.Mutex

	streamsMu sync.Mutex
	streams   map[*streamConn]struct{}
}

// NewDirectory is the DID directory a gateway uses: did:plc through plcURL (empty means
// plc.directory), did:web over HTTPS, with resolved documents cached for an hour.
func NewDirectory(plcURL string) *identity.CacheDirectory {
	base := &identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true,
		HTTPClient: http.Client{Timeout: 10 * time.Second}}
	return identity.NewCacheDirectory(base, 100_000, time.Hour, time.Minute, time.Minute)
}

// DIDForURL is the did:web naming the host and port of u. atproto allows a port in a did:web
// only for localhost, so a loopback address is named localhost: http://127.0.0.1:8080 gives
// did:web:localhost%3A8080 (what the reference PDS accepts as an aud). Any other host must
// come without a port: https://k8s.example.com gives did:web:k8s.example.com.
func DIDForURL(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || p.Hostname() == "" {
		return "", fmt.Errorf("gateway URL %q has no host", u)
	}
	host := p.Hostname()
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		host = "localhost"
	} else if p.Port() != "" {
		return "", fmt.Errorf("gateway URL %q: atproto allows a port in a did:web only for localhost; give a public URL without one", u)
	}
	if p.Port() != "" {
		return "did:web:" + host + "%3A" + p.Port(), nil
	}
	return "did:web:" + host, nil
}

// Start listens and serves until Close.
func Start(cfg Config) (*Server, error) {
	if cfg.Client == nil || cfg.Directory == nil {
		return nil, errors.New("gateway: Client and Directory are required")
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	acc, err := newAccess(cfg.Access)
	if err != nil {
		return nil, err
	}
	rl := cfg.RateLimit.withDefaults()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen: %w", err)
	}
	s := &Server{cfg: cfg, ln: ln, log: cfg.Logger, stopWatch: func() {},
		perIP: newLimiters(rl.PerIP, rl.PerIPBurst), perDID: newLimiters(rl.PerDID, rl.PerDIDBurst)}
	s.access.Store(&acc)
	if cfg.WatchAccess {
		var ctx context.Context
		ctx, s.stopWatch = context.WithCancel(context.Background())
		// The first read is waited for (a bounded time): an account the ConfigMap admits is
		// served from the first call.
		listed := make(chan struct{}, 1)
		go s.watchAccess(ctx, listed)
		select {
		case <-listed:
		case <-time.After(5 * time.Second):
			s.log.Warn("gateway_access", "err", "the GatewayAccess objects not read within 5s; serving the flags' list until they are")
		}
	}
	s.url = cfg.PublicURL
	if s.url == "" {
		s.url = "http://" + ln.Addr().String()
	}
	s.url = strings.TrimRight(s.url, "/")
	if s.did, err = DIDForURL(s.url); err != nil {
		ln.Close()
		return nil, err
	}
	s.auds = append([]string{s.did, s.did + "#" + ServiceID}, cfg.Audiences...)
	s.verifier = serviceauth.New(serviceauth.Config{Directory: cfg.Directory, Audiences: s.auds, Now: cfg.Now})
	s.methods = s.clusterMethods()
	s.methods[cluster.SubscribeClustersNSID] = method{stream: s.subscribeClusters}
	for nsid, m := range s.k8sMethods() {
		s.methods[nsid] = m
	}
	s.srv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second}
	s.srv.RegisterOnShutdown(s.closeStreams)
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway serve", "err", err)
		}
	}()
	s.log.Info("gateway listening", "url", s.url, "did", s.did)
	return s, nil
}

// URL is the gateway's base URL.
func (s *Server) URL() string { return s.url }

// DID is the gateway's service DID.
func (s *Server) DID() string { return s.did }

// Audiences are the aud values tokens may carry.
func (s *Server) Audiences() []string { return append([]string(nil), s.auds...) }

// Close stops serving.
func (s *Server) Close() error {
	s.stopWatch()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}

// method is one XRPC method: a query (GET) or a procedure (POST with JSON input).
type method struct {
	procedure bool
	// call runs with the verified account DID and the raw input (nil for a query) or the
	// query's parameters.
	call func(ctx context.Context, account string, in []byte, params url.Values) (any, error)
	// stream, for a subscription, takes over the connection (a WebSocket upgrade) once the
	// caller is verified.
	stream func(w http.ResponseWriter, r *http.Request, account string)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/did.json", s.didDocument)
	mux.HandleFunc("/xrpc/{nsid}", s.xrpc)
	mux.HandleFunc("GET /xrpc/_health", func(w http.ResponseWriter, _ *http.Request) {
		xrpc.WriteJSON(w, http.StatusOK, map[string]string{"version": "socialweb-gateway"})
	})
	return mux
}

// didDocument serves the did:web document: the service entry a PDS resolves when it proxies
// to the gateway. The gateway has no signing key of its own.
func (s *Server) didDocument(w http.ResponseWriter, _ *http.Request) {
	xrpc.WriteJSON(w, http.StatusOK, map[string]any{
		"@context": []string{"https://www.w3.org/ns/did/v1"},
		"id":       s.did,
		"service": []map[string]string{{
			"id": "#" + ServiceID, "type": "SocialwebGateway", "serviceEndpoint": s.url,
		}},
	})
}

func (s *Server) xrpc(w http.ResponseWriter, r *http.Request) {
	// Every request counts against its address, before anything else is done for it. A
	// refusal is logged at debug only: a flood must not fill the log.
	if ok, wait := s.perIP.allow(clientIP(r), s.now()); !ok {
		s.log.Debug("gateway_rate_limited", "ip", clientIP(r))
		writeError(w, rateLimited("address "+clientIP(r), wait))
		return
	}
	nsid := r.PathValue("nsid")
	m, ok := s.methods[nsid]
	if !ok {
		writeError(w, xrpcErr(http.StatusNotImplemented, ErrMethodNotFound, "method not implemented"))
		return
	}
	if m.stream != nil {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, xrpcErr(http.StatusMethodNotAllowed, ErrInvalidRequest, "%s is a subscription: a GET with a WebSocket upgrade", nsid))
			return
		}
		account, err := s.authenticate(r, nsid)
		if err != nil {
			writeError(w, err)
			return
		}
		m.stream(w, r, account)
		return
	}
	if want := map[bool]string{true: http.MethodPost, false: http.MethodGet}[m.procedure]; r.Method != want {
		w.Header().Set("Allow", want)
		writeError(w, xrpcErr(http.StatusMethodNotAllowed, ErrInvalidRequest, "%s takes %s", nsid, want))
		return
	}
	// Nothing about the call is looked at before the caller is known.
	account, err := s.authenticate(r, nsid)
	if err != nil {
		writeError(w, err)
		return
	}
	var in []byte
	if m.procedure {
		// Before the body is read, so no "100 Continue" precedes the refusal (xrpc.LimitBody).
		if xe := xrpc.LimitBody(w, r, maxBody); xe != nil {
			writeError(w, xe)
			return
		}
		if in, err = io.ReadAll(r.Body); err != nil {
			if xe := xrpc.BodyTooLarge(err); xe != nil {
				writeError(w, xe)
				return
			}
			writeError(w, invalidRequest("reading the input: %v", err))
			return
		}
	}
	out, err := m.call(r.Context(), account, in, r.URL.Query())
	if err != nil {
		var xe *Error
		if !errors.As(err, &xe) {
			s.log.Error("gateway call", "nsid", nsid, "account", account, "err", err)
		}
		writeError(w, err)
		return
	}
	xrpc.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) now() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Now()
}

// authenticate verifies the bearer service-auth token for a call of nsid and returns its
// issuer, the account the call acts for: one the gateway serves, within its rate.
func (s *Server) authenticate(r *http.Request, nsid string) (string, error) {
	account, err := s.verify(r, nsid)
	if err != nil {
		return "", err
	}
	// The verifier resolved the DID; the allow-list was checked on the unverified iss
	// already, and again here on the verified one.
	if !s.access.Load().allows(account) {
		return "", notAllowed(account)
	}
	if ok, wait := s.perDID.allow(account, s.now()); !ok {
		s.log.Debug("gateway_rate_limited", "account", account)
		return "", rateLimited("account "+account, wait)
	}
	return account, nil
}

// verify checks the bearer service-auth token for a call of nsid and returns its issuer.
func (s *Server) verify(r *http.Request, nsid string) (string, error) {
	token, err := xrpc.BearerToken(r.Header.Get("Authorization"))
	if errors.Is(err, xrpc.ErrNoAuthorization) {
		return "", xrpcErr(http.StatusUnauthorized, ErrAuthMissing, "Authentication Required")
	}
	if err != nil {
		return "", xrpcErr(http.StatusUnauthorized, ErrInvalidToken, "expected a Bearer service-auth token")
	}
	if err := s.access.Load().checkIssuer(token); err != nil {
		return "", err
	}
	c, err := s.verifier.Verify(r.Context(), token, nsid)
	if err != nil {
		var se *serviceauth.Error
		if errors.As(err, &se) {
			// The verifier's name (BadJwtSignature, JwtExpired, JwtReplayed, ...) says why.
			return "", xrpcErr(http.StatusUnauthorized, ErrInvalidToken, "%s: %s", se.Name, se.Message)
		}
		return "", xrpcErr(http.StatusUnauthorized, ErrInvalidToken, "%v", err)
	}
	return c.Issuer.String(), nil
}

// decodeInput reads a procedure's JSON input into v; unknown fields are ignored (lexicons
// evolve by adding fields), wrong types and trailing data are refused.
func decodeInput(in []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(in)))
	if err := dec.Decode(v); err != nil {
		return invalidRequest("input is not the method's JSON object: %v", err)
	}
	if dec.More() {
		return invalidRequest("input has data after the JSON object")
	}
	return nil
}
