package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
)

//go:embed assets
var assets embed.FS

var pages = template.Must(template.ParseFS(assets, "assets/*.html"))

// Options configure a console.
type Options struct {
	// Addr is where it listens; a loopback address (port 0 picks a free one).
	Addr string
	// Token is the bearer token that logs in: up's admin token, the one of its kubeconfig.
	Token string
	// Config reaches the API server whose objects the console shows.
	Config *rest.Config
	// PDSURL, when set, links record at-URIs to that PDS's getRecord.
	PDSURL string
	// TenantConfig, when set, reaches the apiserver of a tenant cluster as its admin: the
	// console then shows the cluster's nodes and pending pods.
	TenantConfig func(namespace, name string) (*rest.Config, error)
	// GuestLogs, when set, reads the last lines of the log of the guest booted for an
	// accept (a local bidder's): the console then shows them under the contract.
	GuestLogs func(ctx context.Context, acceptURI string, tail int) ([]byte, error)
	Logger    *slog.Logger
}

// Console is a running console.
type Console struct {
	o       Options
	ln      net.Listener
	srv     *http.Server
	session string // the cookie value a login hands out; new on every start
	hosts   []string
	cache   cache.Cache
	stop    context.CancelFunc

	mu    sync.Mutex
	seen  map[string][]Milestone
	view  []byte // the current rendering of the view
	subs  map[chan []byte]struct{}
	dirty chan struct{}
	// tenants are the watches of tenant clusters, by namespace/name.
	tenants map[string]*tenantWatch
	// logs are the tails of the guests' logs, by ComputeContract namespace/name.
	logs map[string]string
}

// NotLoopbackError refuses a listen address off this machine: the console shows
// everything up holds and is meant for the person at this machine.
type NotLoopbackError struct{ Addr string }

func (e *NotLoopbackError) Error() string {
	return fmt.Sprintf("console address %s: want a loopback address such as 127.0.0.1:0", e.Addr)
}

const cookieName = "socialweb_console"

// Start syncs the informers, renders the first view and serves the console until Close.
func Start(ctx context.Context, o Options) (*Console, error) {
	if o.Token == "" {
		return nil, errors.New("console: no token to log in with")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	host, _, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return nil, fmt.Errorf("console address %s: %w", o.Addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, &NotLoopbackError{Addr: o.Addr}
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	cctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c := &Console{o: o, stop: stop, seen: map[string][]Milestone{}, subs: map[chan []byte]struct{}{}, dirty: make(chan struct{}, 1),
		tenants: map[string]*tenantWatch{}}
	c.session = randomHex()
	c.cache, err = cache.New(o.Config, cache.Options{Scheme: scheme})
	if err != nil {
		stop()
		return nil, err
	}
	for _, obj := range []client.Object{&v1alpha1.Infra{}, &v1alpha1.EphemeralInfra{}, &v1alpha1.ComputeContract{},
		&v1alpha1.Cluster{}, &v1alpha1.NodeClaim{}} {
		inf, err := c.cache.GetInformer(cctx, obj)
		if err != nil {
			stop()
			return nil, err
		}
		if _, err := inf.AddEventHandler(c.handler()); err != nil {
			stop()
			return nil, err
		}
	}
	go func() {
		if err := c.cache.Start(cctx); err != nil {
			o.Logger.Error("console informers stopped", "err", err)
		}
	}()
	if !c.cache.WaitForCacheSync(ctx) {
		stop()
		return nil, errors.New("console: informers did not sync")
	}
	c.render(cctx)
	go c.renderLoop(cctx)
	go c.followLogs(cctx)

	c.ln, err = net.Listen("tcp", o.Addr)
	if err != nil {
		stop()
		return nil, err
	}
	_, port, _ := net.SplitHostPort(c.ln.Addr().String())
	c.hosts = []string{c.ln.Addr().String(), net.JoinHostPort("localhost", port)}
	// No WriteTimeout: the event stream is one long response.
	c.srv = &http.Server{Handler: c.routes(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute,
		BaseContext: func(net.Listener) context.Context { return cctx }}
	go func() {
		if err := c.srv.Serve(c.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Logger.Error("console stopped serving", "err", err)
		}
	}()
	return c, nil
}

// URL is where the console serves.
func (c *Console) URL() string { return "http://" + c.ln.Addr().String() + "/" }

// Close stops serving, ends the event streams and the informers.
func (c *Console) Close() error {
	c.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.srv.Shutdown(ctx)
}

// handler marks the view dirty on any change; for ComputeContracts it also records what the
// change brought (a bid, the receipt) with the time the console saw it, for the timeline.
func (c *Console) handler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if cc, ok := obj.(*v1alpha1.ComputeContract); ok && !initial {
				c.note(cc, Milestones(nil, cc, time.Now()))
			}
			c.changed()
		},
		UpdateFunc: func(oldObj, newObj any) {
			if cc, ok := newObj.(*v1alpha1.ComputeContract); ok {
				prev, _ := oldObj.(*v1alpha1.ComputeContract)
				c.note(cc, Milestones(prev, cc, time.Now()))
			}
			c.changed()
		},
		DeleteFunc: func(obj any) {
			if cc, ok := obj.(*v1alpha1.ComputeContract); ok {
				c.mu.Lock()
				delete(c.seen, cc.Namespace+"/"+cc.Name)
				c.mu.Unlock()
			}
			c.changed()
		},
	}
}

func (c *Console) note(cc *v1alpha1.ComputeContract, ms []Milestone) {
	if len(ms) == 0 {
		return
	}
	k := cc.Namespace + "/" + cc.Name
	c.mu.Lock()
	c.seen[k] = append(c.seen[k], ms...)
	c.mu.Unlock()
}

func (c *Console) changed() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// renderLoop renders once per burst of changes: a reconcile writes several objects within
// milliseconds of each other, and one rendering after the burst shows them all.
func (c *Console) renderLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			c.stopTenants()
			c.mu.Lock()
			for ch := range c.subs {
				close(ch)
				delete(c.subs, ch)
			}
			c.mu.Unlock()
			return
		case <-c.dirty:
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
		c.render(ctx)
	}
}

func (c *Console) render(ctx context.Context) {
	var s Snapshot
	var il v1alpha1.InfraList
	var el v1alpha1.EphemeralInfraList
	var cl v1alpha1.ComputeContractList
	var kl v1alpha1.ClusterList
	var nl v1alpha1.NodeClaimList
	for _, l := range []client.ObjectList{&il, &el, &cl, &kl, &nl} {
		if err := c.cache.List(ctx, l); err != nil {
			c.o.Logger.Error("console: list", "err", err)
			return
		}
	}
	s.Infras, s.Ephemerals, s.Contracts, s.Clusters, s.NodeClaims = il.Items, el.Items, cl.Items, kl.Items, nl.Items
	s.PDSURL = c.o.PDSURL
	c.mu.Lock()
	s.Seen = make(map[string][]Milestone, len(c.seen))
	for k, v := range c.seen {
		s.Seen[k] = v
	}
	c.syncTenants(s.Clusters)
	s.Tenants = c.tenantObjects()
	s.Logs = c.logs
	c.mu.Unlock()
	var b bytes.Buffer
	if err := pages.ExecuteTemplate(&b, "view", Build(s)); err != nil {
		c.o.Logger.Error("console: render", "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bytes.Equal(b.Bytes(), c.view) {
		return
	}
	c.view = b.Bytes()
	for ch := range c.subs {
		// Each subscriber wants the latest rendering, not every one: replace what it has
		// not taken yet.
		select {
		case <-ch:
		default:
		}
		ch <- c.view
	}
}

func (c *Console) subscribe() (chan []byte, func()) {
	ch := make(chan []byte, 1)
	c.mu.Lock()
	c.subs[ch] = struct{}{}
	ch <- c.view
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		delete(c.subs, ch)
		c.mu.Unlock()
	}
}

// securityHeaders go on every response: only this origin's script and style, no framing, no
// referrer, nothing cached. No Access-Control header is ever set: other origins get nothing.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}

func (c *Console) routes() http.Handler {
	static, _ := fs.Sub(assets, "assets")
	files := http.FileServerFS(static)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /console.js", func(w http.ResponseWriter, r *http.Request) { files.ServeHTTP(w, r) })
	mux.HandleFunc("GET /console.css", func(w http.ResponseWriter, r *http.Request) { files.ServeHTTP(w, r) })
	mux.HandleFunc("GET /login", c.login)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("GET /{$}", c.authed(c.page))
	mux.HandleFunc("GET /events", c.authed(c.events))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		// A page elsewhere that resolves its own name to 127.0.0.1 (DNS rebinding) reaches
		// this port with its own name as Host: refused before anything else.
		if !hostAllowed(r.Host, c.hosts) {
			http.Error(w, "this console answers only to "+strings.Join(c.hosts, " or "), http.StatusMisdirectedRequest)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func hostAllowed(host string, allowed []string) bool {
	for _, a := range allowed {
		if strings.EqualFold(host, a) {
			return true
		}
	}
	return false
}

func (c *Console) authorized(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && equal(tok, c.o.Token) {
		return true
	}
	ck, err := r.Cookie(cookieName)
	return err == nil && equal(ck.Value, c.session)
}

func equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

func (c *Console) authed(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !c.authorized(r) {
			c.loginPage(w, http.StatusUnauthorized, "Not logged in.")
			return
		}
		h(w, r)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, code int, why string) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_ = pages.ExecuteTemplate(w, "login", why)
}

// login trades the token for a session cookie: HttpOnly (no script reads it), SameSite
// Strict (no other site's page sends it). The form's POST must come from this origin.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	tok := r.URL.Query().Get("token")
	if r.Method == http.MethodPost {
		if !sameOrigin(r, c.hosts) {
			http.Error(w, "cross-origin login refused", http.StatusForbidden)
			return
		}
		tok = r.PostFormValue("token")
	} else if tok == "" {
		c.loginPage(w, http.StatusOK, "Log in to see the console.")
		return
	}
	if !equal(tok, c.o.Token) {
		c.loginPage(w, http.StatusUnauthorized, "Wrong token.")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: c.session, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	// Off the URL that holds the token.
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// sameOrigin holds when the browser says the request comes from this console's own origin:
// Origin names one of its hosts, or, without Origin, Sec-Fetch-Site is same-origin.
// A request with neither is refused: every browser that can run the page sends one.
func sameOrigin(r *http.Request, hosts []string) bool {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && u.Scheme == "http" && hostAllowed(u.Host, hosts)
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

func (c *Console) page(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	view := c.view
	c.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = pages.ExecuteTemplate(w, "page", template.HTML(view)) // already rendered by html/template
}

// events streams every new rendering of the view as a server-sent event "view".
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	ch, unsubscribe := c.subscribe()
	defer unsubscribe()
	heartbeat := time.NewTicker(25 * time.Second)
	defer heartbeat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-heartbeat.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case view, ok := <-ch:
			if !ok {
				return
			}
			if _, err := w.Write(sseEvent("view", view)); err != nil {
				return
			}
		}
		fl.Flush()
	}
}

// sseEvent frames data as one server-sent event: a data line per line of data.
func sseEvent(name string, data []byte) []byte {
	var b bytes.Buffer
	b.WriteString("event: " + name + "\n")
	// A lone CR ends a line in the event-stream format too: every line break is made LF, so
	// no text inside a value can start a field of its own.
	data = bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	for _, l := range bytes.Split(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(l)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

func randomHex() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
