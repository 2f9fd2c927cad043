package bidder

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"socialweb.computer/internal/atomicfile"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/market"
	"socialweb.computer/internal/serviceauth"
	"socialweb.computer/internal/substrate"
	"socialweb.computer/internal/xrpc"
)

// awaiting is an accepted contract whose guest waits for its secrets.
type awaiting struct {
	requester string   // the accept's author: the only DID allowed to deliver
	names     []string // the names the payload declared, sorted
	got       chan map[string][]byte
	delivered bool
	stop      chan struct{} // closed when the contract is released before delivery
	stopped   bool
}

// deliveredTo is an accept whose secrets were delivered, kept until its contract ends so a
// repeated delivery is answered as the first was. It is saved in the state dir (never a
// value), so that this holds across a restart of the bidder too.
type deliveredTo struct {
	Requester string `json:"requester"`
	Count     int    `json:"count"`
}

// deliveredFile is the state dir's record of the accepts whose secrets were taken.
const deliveredFile = "secrets-delivered.json"

// deliveredState is deliveredFile's content.
type deliveredState struct {
	Accepts map[string]deliveredTo `json:"accepts"`
}

// loadDelivered reads what a previous run of the bidder saved (nothing without a state dir).
func (b *Bidder) loadDelivered() error {
	if b.cfg.StateDir == "" {
		return nil
	}
	raw, err := os.ReadFile(filepath.Join(b.cfg.StateDir, deliveredFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	var st deliveredState
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("state %s: %w", deliveredFile, err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for acc, d := range st.Accepts {
		b.delivered[acc] = d
	}
	return nil
}

// saveDelivered writes b.delivered to the state dir (0600, replaced atomically). Called
// with b.mu held.
func (b *Bidder) saveDelivered() error {
	if b.cfg.StateDir == "" {
		return nil
	}
	if err := os.MkdirAll(b.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	raw, err := json.Marshal(deliveredState{Accepts: b.delivered})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(b.cfg.StateDir, deliveredFile), raw, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// maxSecretsBody bounds a deliverSecrets request (64 values of 64 KiB, base64, and JSON).
const maxSecretsBody = 6 << 20

func xerr(status int, name, format string, a ...any) *xrpc.Error {
	return xrpc.Errorf(status, name, format, a...)
}

// EndpointError is a secrets endpoint no requester would send secrets to, and why.
type EndpointError struct{ Reason string }

func (e *EndpointError) Error() string { return "secrets endpoint: " + e.Reason }

// SecretsEndpointURL is the endpointUrl an offering publishes for a secrets endpoint
// listening on listening (host:port) with or without TLS, or publicURL when one is given. It
// refuses what a requester refuses (plain http to a host that is not loopback, a URL that
// is not an origin) and an address no one can dial (0.0.0.0, ::), so a misconfigured bidder
// fails at its start rather than at its first won contract.
func SecretsEndpointURL(listening, publicURL string, overTLS bool) (string, error) {
	if publicURL != "" {
		u, err := url.Parse(publicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return "", &EndpointError{Reason: fmt.Sprintf("public URL %q: want an origin, https://host[:port]", publicURL)}
		}
		if u.Scheme == "http" && !market.PlainHTTPAllowed(u.Hostname()) {
			return "", &EndpointError{Reason: fmt.Sprintf("public URL %q: requesters send secrets over plain http to a loopback host only; publish https", publicURL)}
		}
		return u.Scheme + "://" + u.Host, nil
	}
	host, _, err := net.SplitHostPort(listening)
	if err != nil {
		return "", &EndpointError{Reason: fmt.Sprintf("listen address %q: %v", listening, err)}
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", &EndpointError{Reason: fmt.Sprintf("listening on %s, which names no host to publish: give the URL requesters reach it at (--public-url)", listening)}
	}
	if overTLS {
		return "https://" + listening, nil
	}
	if !market.PlainHTTPAllowed(host) {
		return "", &EndpointError{Reason: fmt.Sprintf("listening on %s over plain http: requesters send secrets over plain http to a loopback host only; serve https (--tls-cert, --tls-key) or publish the https URL of a proxy in front of it (--public-url)", listening)}
	}
	return "http://" + listening, nil
}

// serveSecrets listens on cfg.Listen and serves the deliverSecrets procedure until ctx ends,
// over https when the config names a certificate. It returns the endpoint URL to publish in
// the offering.
func (b *Bidder) serveSecrets(ctx context.Context) (string, error) {
	addr := b.cfg.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if (b.cfg.TLSCertFile == "") != (b.cfg.TLSKeyFile == "") {
		return "", &EndpointError{Reason: "a certificate needs both its file and its key's (--tls-cert, --tls-key)"}
	}
	var certs *certwatcher.CertWatcher
	if b.cfg.TLSCertFile != "" {
		var err error
		if certs, err = certwatcher.New(b.cfg.TLSCertFile, b.cfg.TLSKeyFile); err != nil {
			return "", &EndpointError{Reason: err.Error()}
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("secrets endpoint: %w", err)
	}
	endpoint, err := SecretsEndpointURL(ln.Addr().String(), b.cfg.PublicURL, certs != nil)
	if err != nil {
		ln.Close()
		return "", err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/"+mk.DeliverSecretsNSID, b.handleDeliver)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if certs != nil {
		go func() {
			if err := certs.Start(ctx); err != nil {
				b.log.Warn("watching the secrets endpoint's certificate", "err", err)
			}
		}()
		ln = tls.NewListener(ln, &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12})
	}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return endpoint, nil
}

func (b *Bidder) handleDeliver(w http.ResponseWriter, r *http.Request) {
	n, err := b.deliver(r)
	if err != nil {
		var xe *xrpc.Error
		if !errors.As(err, &xe) {
			xe = xerr(http.StatusInternalServerError, xrpc.InternalServerError, "%v", err)
		}
		// The message names the refusal, never a value.
		b.log.Warn("market_secrets_refused", "reason", xe.Name, "message", xe.Message)
		xrpc.WriteError(w, xe)
		return
	}
	xrpc.WriteJSON(w, http.StatusOK, mk.DeliverSecretsOutput{Delivered: int64(n)})
}

// deliver checks one deliverSecrets call and hands its values to the waiting guest.
func (b *Bidder) deliver(r *http.Request) (int, error) {
	if r.Method != http.MethodPost {
		return 0, xerr(http.StatusMethodNotAllowed, xrpc.InvalidRequest, "%s is a procedure: POST it", mk.DeliverSecretsNSID)
	}
	tok, err := xrpc.BearerToken(r.Header.Get("Authorization"))
	if err != nil {
		return 0, xerr(http.StatusUnauthorized, xrpc.AuthMissing, "a service-auth token from the contract's requester is required (Authorization: Bearer)")
	}
	claims, err := b.verifier.Verify(r.Context(), tok, mk.DeliverSecretsNSID)
	if err != nil {
		var se *serviceauth.Error
		if errors.As(err, &se) {
			return 0, xerr(http.StatusUnauthorized, se.Name, "%s", se.Message)
		}
		return 0, xerr(http.StatusUnauthorized, xrpc.InvalidToken, "%v", err)
	}
	select {
	case <-b.recovered:
	case <-r.Context().Done():
		return 0, xerr(http.StatusServiceUnavailable, "NotReady", "the bidder is starting")
	}
	var in mk.DeliverSecretsInput
	if xe := xrpc.LimitBody(nil, r, maxSecretsBody); xe != nil {
		return 0, xe
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		if xe := xrpc.BodyTooLarge(err); xe != nil {
			return 0, xe
		}
		return 0, xerr(http.StatusBadRequest, xrpc.InvalidRequest, "body is not a deliverSecrets input: %s", jsonReason(err))
	}
	b.mu.Lock()
	a := b.awaiting[in.Accept]
	done, wasDelivered := b.delivered[in.Accept]
	b.mu.Unlock()
	if a == nil && wasDelivered {
		if claims.Issuer.String() != done.Requester {
			return 0, xerr(http.StatusForbidden, "NotRequester", "the token's issuer %s is not the author of the accept (%s)", claims.Issuer, done.Requester)
		}
		// Delivered before (the requester may not have recorded our answer): taken, nothing
		// changes; the values of this call are dropped.
		return done.Count, nil
	}
	if a == nil {
		return 0, xerr(http.StatusBadRequest, "UnknownAccept", "no accept of a bid of %s waits for secrets: %s", b.DID(), in.Accept)
	}
	if claims.Issuer.String() != a.requester {
		return 0, xerr(http.StatusForbidden, "NotRequester", "the token's issuer %s is not the author of the accept (%s)", claims.Issuer, a.requester)
	}
	vals := make(map[string][]byte, len(in.Secrets))
	names := make([]string, 0, len(in.Secrets))
	for _, s := range in.Secrets {
		if !substrate.ValidSecretName(s.Name) {
			return 0, xerr(http.StatusBadRequest, "InvalidSecrets", "secret name %q: want [A-Za-z0-9][A-Za-z0-9_-]*, at most 63", s.Name)
		}
		if _, dup := vals[s.Name]; dup {
			return 0, xerr(http.StatusBadRequest, "InvalidSecrets", "secret %q given twice", s.Name)
		}
		v, err := base64.StdEncoding.DecodeString(s.Value)
		if err != nil {
			return 0, xerr(http.StatusBadRequest, "InvalidSecrets", "secret %q: value is not standard base64", s.Name)
		}
		vals[s.Name] = v
		names = append(names, s.Name)
	}
	sort.Strings(names)
	if !slices.Equal(names, a.names) {
		return 0, xerr(http.StatusBadRequest, "InvalidSecrets", "secrets %v given, the payload names %v", names, a.names)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if a.stopped { // the contract ended meanwhile
		return 0, xerr(http.StatusBadRequest, "UnknownAccept", "no accept of a bid of %s waits for secrets: %s", b.DID(), in.Accept)
	}
	if !a.delivered {
		// Saved before the guest gets the values: a bidder restarted after this answer still
		// knows it took them.
		b.delivered[in.Accept] = deliveredTo{Requester: a.requester, Count: len(vals)}
		if err := b.saveDelivered(); err != nil {
			delete(b.delivered, in.Accept)
			return 0, err
		}
		a.delivered = true
		a.got <- vals
		b.log.Info("market_secrets_delivered", "accept", in.Accept, "requester", a.requester, "count", len(vals))
	}
	return len(vals), nil
}

func jsonReason(err error) string {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fmt.Sprintf("larger than %d bytes", mbe.Limit)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset) // never the input itself
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("field %s: want %s", te.Field, te.Type)
	}
	return "unreadable"
}
