package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/app"
	"socialweb.computer/internal/console"
	"socialweb.computer/internal/testenv"
)

// The console rows drive Debian's chromium, headless, with chromedp. Screenshots go to
// $SOCIALWEB_TEST_ARTIFACTS/<row> when that is set (kept), else to a temporary directory
// that is kept only when the row fails; the row logs where.

// browser is a headless chromium tab of a console row and where its screenshots go.
type browser struct {
	t         *testing.T
	ctx       context.Context
	artifacts string
	shots     int
}

func startBrowser(t *testing.T) *browser {
	t.Helper()
	exe := requireTool(t, "chromium")
	dir := os.Getenv("SOCIALWEB_TEST_ARTIFACTS")
	if dir != "" {
		dir = filepath.Join(dir, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	} else {
		var err error
		if dir, err = os.MkdirTemp("", "socialweb-console-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !t.Failed() {
				os.RemoveAll(dir)
			}
		})
	}
	t.Logf("console screenshots in %s", dir)
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // the rows run as root, where chromium's sandbox refuses to start
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-component-update", true),
		// No name is ever resolved: the console is on 127.0.0.1 and nothing else is a target.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("proxy-server", "direct://"),
		chromedp.WindowSize(1280, 1400),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, artifacts: dir}
}

// fail fails the row with a screenshot and the page's text.
func (b *browser) fail(what string, err error) {
	b.t.Helper()
	b.shot("failed-" + what)
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	text, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("body")))
	b.t.Fatalf("%s: %v\npage:\n%s", what, err, text)
}

// do runs steps within timeout and fails the row if they fail.
func (b *browser) do(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fail(what, err)
	}
}

// shot writes a screenshot of the whole page as NN-name.png.
func (b *browser) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.shots++
	p := filepath.Join(b.artifacts, fmt.Sprintf("%02d-%s.png", b.shots, regexp.MustCompile(`[^a-z0-9-]+`).ReplaceAllString(name, "-")))
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Error(err)
	}
}

// waitJS waits until the expression is true in the page; it is evaluated on every change
// of the DOM rather than on a timer.
func (b *browser) waitJS(what, expr string, timeout time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(timeout))); err != nil {
		b.fail(what, err)
	}
}

func evalJS[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fail("eval "+expr, err)
	}
	return v
}

// login opens the console through its token login and waits until its event stream is live.
// openDetails clicks the summary of the details at css as a reader would, until it is open:
// an update that lands between the click's hit test and the mouse events replaces the element
// under the pointer, and a reader whose click was swallowed that way clicks again.
func (b *browser) openDetails(what, css string) {
	b.t.Helper()
	isOpen := fmt.Sprintf(`document.querySelector(%s)?.open === true`, jsString(css))
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(css+" summary")))
		if err == nil {
			_, err = chromedp.Run(ctx, chromedp.Poll[bool](isOpen, chromedp.WithPollingTimeout(2*time.Second)))
		}
		cancel()
		if err == nil {
			return
		}
		if try == 5 {
			b.fail("open "+what, err)
		}
		b.t.Logf("open %s: try %d: %v", what, try, err)
	}
}

func (b *browser) login(consoleURL, token string) {
	b.t.Helper()
	b.do("login", 30*time.Second, chromedp.Navigate(consoleURL+"login?token="+token))
	b.waitJS("the event stream live", `document.getElementById("conn")?.textContent === "live"`, 30*time.Second)
	loc := evalJS[string](b, "location.href")
	if loc != consoleURL {
		b.t.Fatalf("after login the page is %s, want %s (off the URL that holds the token)", loc, consoleURL)
	}
}

func jsString(s string) string { return fmt.Sprintf("%q", s) }

// deploymentPhase is a JS test of a deployment's phase as the page shows it.
func deploymentPhase(name, phase string) string {
	return fmt.Sprintf(`document.querySelector('article.deployment[data-name=%s]')?.dataset.phase === %s`, jsString(name), jsString(phase))
}

func contractPhase(deployment, contract, phase string) string {
	return fmt.Sprintf(`document.querySelector('article.deployment[data-name=%s] tr.contract[data-contract=%s]')?.dataset.phase === %s`,
		jsString(deployment), jsString(contract), jsString(phase))
}

// The console of `socialweb up`, in a real browser: an Infra applied with kubectl shows up
// Staged, its contract goes Requesting, a bid appears with its bidder (up's deno bidder), and
// the deployment goes Deployed with a timeline from Requested on and the guest's log (markup
// in it shown as text), all without a reload (a value the page's script set at load
// survives). No credential and a wrong one get 401.
func TestConsole_BrowserShowsADeploymentLive(t *testing.T) {
	requireTool(t, "kubectl")
	dir := filepath.Join(t.TempDir(), "data")
	up := startUp(t, dir)
	consoleURL := up.phase(t, "console serving at ")
	denoBidder := up.phase(t, "local bidder "+app.LocalBidderHandle)
	token := readToken(t, dir)
	checkConsoleAuth(t, consoleURL, token)

	b := startBrowser(t)
	b.login(consoleURL, token)
	loadedAt := evalJS[float64](b, "window.consoleLoadedAt")
	b.shot("empty")

	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: AtprotoRepo
metadata: {name: me, namespace: default}
spec: {local: {account: owner.test}}
---
apiVersion: socialweb.computer/v1alpha1
kind: Infra
metadata: {name: web, namespace: default}
spec:
  description: a small web app
  record: {repoRef: {name: me}}
  contracts:
  - name: api
    computeKind: deno
    policyArgs: {bidWindowSec: "3"}
    userData: |
      console.log("guest says <img src=x onerror=\"window.pwned = 'log'\"> hello")
      setInterval(() => {}, 1000)
`, "apply", "-f", "-")
	c := coreClient(t, dir)
	t.Cleanup(func() {
		// Gone before up stops: its finalizer releases the guest, which would otherwise
		// outlive up.
		ctx := context.Background()
		if err := c.Delete(ctx, &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}); client.IgnoreNotFound(err) != nil {
			t.Error(err)
			return
		}
		testenv.Eventually(t, 60*time.Second, "the Infra gone", func() (bool, error) {
			err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web"}, &v1alpha1.Infra{})
			return apierrors.IsNotFound(err), err
		})
	})
	b.waitJS("web Staged", deploymentPhase("web", "Staged"), 30*time.Second)
	b.waitJS("the record's at-URI", `[...document.querySelectorAll('article.deployment[data-name="web"] .meta .uri')].some(e => e.textContent.startsWith("at://"))`, 30*time.Second)
	b.shot("staged")

	up.kubectl(t, "", "patch", "infra", "web", "--type=json", "-p", `[{"op":"replace","path":"/spec/contracts/0/state","value":"Requested"}]`)
	b.waitJS("api Requesting", contractPhase("web", "api", "Requesting"), 30*time.Second)
	b.shot("requesting")
	b.waitJS("a bid from "+denoBidder, fmt.Sprintf(`[...document.querySelectorAll('li.bid .bidder')].some(e => e.textContent === %s)`, jsString(denoBidder)), 60*time.Second)
	market := `article.deployment[data-name="web"] details`
	b.openDetails("the market", market)
	openedAt := evalJS[int](b, "window.consoleUpdates")
	b.shot("bid")
	b.waitJS("web Deployed", deploymentPhase("web", "Deployed")+" && "+contractPhase("web", "api", "Deployed"), 60*time.Second)
	b.waitJS("the receipt", `[...document.querySelectorAll('article.deployment[data-name="web"] .timeline td')].some(e => e.textContent === "receipt")`, 30*time.Second)
	// The guest's log, hostile markup and all, shown as text.
	b.waitJS("the guest's log", `[...document.querySelectorAll('article.deployment[data-name="web"] pre.log')].some(e => e.textContent.includes("guest says <img src=x onerror=\"window.pwned = 'log'\"> hello"))`, 30*time.Second)
	b.shot("deployed")
	// A change after the reader opened the market, whatever the market's pace: a deployment
	// declared now must appear without closing what is open.
	up.kubectl(t, `apiVersion: socialweb.computer/v1alpha1
kind: Infra
metadata: {name: notes, namespace: default}
spec:
  record: {repoRef: {name: me}}
  contracts: [{name: db, computeKind: deno}]
`, "apply", "-f", "-")
	b.waitJS("notes Staged", deploymentPhase("notes", "Staged"), 30*time.Second)
	if n := evalJS[int](b, `document.querySelectorAll('#view img').length`); n != 0 {
		t.Errorf("%d img elements in the page: the guest's log was not shown as text", n)
	}
	if p := evalJS[string](b, `String(window.pwned)`); p != "undefined" {
		t.Errorf("the guest's log ran script: window.pwned = %s", p)
	}

	timeline := evalJS[[]string](b, `[...document.querySelectorAll('article.deployment[data-name="web"] .timeline tr')].slice(1).map(r => r.cells[2].textContent)`)
	for _, step := range []string{"Requested", "RFP published", "bid", "accepted", "receipt", "Held"} {
		if !slices.Contains(timeline, step) {
			t.Errorf("timeline %q lacks %q", timeline, step)
		}
	}
	if timeline[0] != "Requested" {
		t.Errorf("timeline %q does not start at Requested", timeline)
	}
	winner := evalJS[string](b, `document.querySelector('article.deployment[data-name="web"] li.bid.won .bidder')?.textContent ?? ""`)
	if winner != denoBidder {
		t.Errorf("the winning bid shows bidder %q, want %s", winner, denoBidder)
	}
	open := evalJS[bool](b, fmt.Sprintf(`document.querySelector(%s).open`, jsString(market)))
	if since := evalJS[int](b, "window.consoleUpdates") - openedAt; !open {
		t.Errorf("the market the reader opened closed on one of the %d updates since", since)
	} else if since == 0 {
		t.Error("no update since the reader opened the market: that it stays open shows nothing")
	}
	after := evalJS[float64](b, "window.consoleLoadedAt")
	updates := evalJS[int](b, "window.consoleUpdates")
	if after != loadedAt {
		t.Errorf("the page was reloaded: loaded at %v, now %v", loadedAt, after)
	}
	if updates < 4 {
		t.Errorf("%d live updates, want at least Staged, Requesting, the bid and Deployed", updates)
	}
}

func readToken(t *testing.T, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pki", "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// checkConsoleAuth: the page and its event stream answer 401 with no credential and with a
// wrong one (bearer, login, cookie); the right bearer token is let in.
func checkConsoleAuth(t *testing.T, consoleURL, token string) {
	t.Helper()
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, set func(*http.Request)) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, consoleURL+path, nil)
		if set != nil {
			set(req)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	wrong := strings.Repeat("0", len(token))
	for _, row := range []struct {
		name, path string
		set        func(*http.Request)
	}{
		{"no credential", "", nil},
		{"no credential, events", "events", nil},
		{"wrong bearer", "", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+wrong) }},
		{"wrong bearer, events", "events", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+wrong) }},
		{"the token as a cookie", "", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "socialweb_console", Value: token}) }},
		{"wrong login", "login?token=" + wrong, nil},
	} {
		if resp := get(row.path, row.set); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", row.name, resp.StatusCode)
		} else if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", row.name, csp)
		}
	}
	if resp := get("", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }); resp.StatusCode != http.StatusOK {
		t.Errorf("the right bearer token: %d, want 200", resp.StatusCode)
	}
	// A page elsewhere that rebinds its name to 127.0.0.1 comes with its own Host.
	if resp := get("", func(r *http.Request) { r.Host = "evil.test"; r.Header.Set("Authorization", "Bearer "+token) }); resp.StatusCode == http.StatusOK {
		t.Errorf("another Host name: %d, want a refusal", resp.StatusCode)
	}
	// The login form's POST: only from the console's own origin.
	post := func(origin, tok string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, consoleURL+"login", strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	own := strings.TrimSuffix(consoleURL, "/")
	for _, row := range []struct {
		origin, token string
		want          int
	}{
		{"http://evil.test", token, http.StatusForbidden},
		{"", token, http.StatusForbidden}, // neither Origin nor Sec-Fetch-Site
		{own, wrong, http.StatusUnauthorized},
		{own, token, http.StatusSeeOther},
	} {
		resp := post(row.origin, row.token)
		if resp.StatusCode != row.want {
			t.Errorf("login form from origin %q: %d, want %d", row.origin, resp.StatusCode, row.want)
		}
		if row.want != http.StatusSeeOther && len(resp.Cookies()) != 0 {
			t.Errorf("login form from origin %q set cookies %v", row.origin, resp.Cookies())
		}
	}
	login := get("login?token="+token, nil)
	if login.StatusCode != http.StatusSeeOther || len(login.Cookies()) != 1 {
		t.Fatalf("login: %d with cookies %v, want 303 and one cookie", login.StatusCode, login.Cookies())
	}
	ck := login.Cookies()[0]
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Value == token {
		t.Errorf("session cookie %+v: want HttpOnly, SameSite=Strict and not the token itself", ck)
	}
	if resp := get("", func(r *http.Request) { r.AddCookie(ck) }); resp.StatusCode != http.StatusOK {
		t.Errorf("with the session cookie: %d, want 200", resp.StatusCode)
	}
}

// The console faces hostile input: a record field (an Infra's description, published to and
// pulled from its record) holding markup shows as text, and no script of it runs, in a
// real browser. The console runs in process here over a testenv core, as up runs it.
func TestSecurity_ConsoleShowsHostileValuesAsText(t *testing.T) {
	env := testenv.Start(t, testenv.Options{Controllers: true, PDS: true})
	con, err := console.Start(context.Background(), console.Options{Addr: "127.0.0.1:0", Token: env.Config.BearerToken, Config: env.Config, PDSURL: env.PDS.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	checkConsoleAuth(t, con.URL(), env.Config.BearerToken)

	b := startBrowser(t)
	b.login(con.URL(), env.Config.BearerToken)
	hostile := []string{
		`<script>window.pwned = "script"</script>`,
		`"><img src=x onerror="window.pwned = 'img'">`,
		`'><svg onload="window.pwned = 'svg'">`,
		"</p><iframe src=\"javascript:parent.pwned='iframe'\"></iframe>\r\nevent: view\r\ndata: <img src=x onerror=\"window.pwned='sse'\">",
	}
	localRepo(t, env, "me")
	for i, h := range hostile {
		newInfra(t, env, fmt.Sprintf("evil%d", i), h, []string{"api"})
	}
	// Staged: reconciled, the description in the record too, and the page updated since.
	b.waitJS("every deployment shown Staged", fmt.Sprintf(`document.querySelectorAll('article.deployment[data-phase="Staged"]').length === %d`, len(hostile)), 30*time.Second)
	for i, h := range hostile {
		name := fmt.Sprintf("evil%d", i)
		testenv.Eventually(t, 30*time.Second, name+"'s record holds the description", func() (bool, error) {
			rec := pdsRecord(t, env, infraNSID, name)
			return rec != nil && deref(rec.Description) == h, fmt.Errorf("record %s", statusJSON(rec))
		})
		want := strings.ReplaceAll(strings.ReplaceAll(h, "\r\n", "\n"), "\r", "\n") // as HTML parsing reads line breaks
		got := evalJS[string](b, fmt.Sprintf(`document.querySelector('article.deployment[data-name=%s] .desc')?.textContent ?? "(none)"`, jsString(name)))
		if got != want {
			t.Errorf("%s: the page shows the description as %q, want the text %q", name, got, want)
		}
	}
	b.shot("hostile")
	// An error handler runs once its image fails to load: give it time to.
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Second)
	pwned, _ := chromedp.Run(ctx, chromedp.Poll[string](`window.pwned`, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(2*time.Second)))
	cancel()
	if pwned != "" {
		t.Errorf("a hostile value ran script: window.pwned = %q", pwned)
	}
	elems := evalJS[int](b, `document.querySelectorAll('#view script, #view img, #view svg, #view iframe').length`)
	if elems != 0 {
		t.Errorf("%d elements of hostile markup in the page, want its text only", elems)
	}
}

// The console's update latency: from an object change (an Infra's description patched) to
// the page in a browser showing it, through the informer, the rendering, the event stream
// and the page's script. The time the page showed it is read from the page's clock (the
// same host's clock), so the devtools round trip is not counted. Printed, not asserted:
// the goal is p99 < 500 ms. SOCIALWEB_BENCH=1 runs it.
func TestBench_ConsoleUpdateLatency(t *testing.T) {
	if os.Getenv("SOCIALWEB_BENCH") == "" {
		t.Skip("SOCIALWEB_BENCH=1 runs the benchmark")
	}
	env := testenv.Start(t, testenv.Options{Controllers: true})
	con, err := console.Start(context.Background(), console.Options{Addr: "127.0.0.1:0", Token: env.Config.BearerToken, Config: env.Config})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { con.Close() })
	b := startBrowser(t)
	b.login(con.URL(), env.Config.BearerToken)
	// Other deployments on the page, so each rendering is of a page of some size.
	for i := range 20 {
		inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("other%d", i)},
			Spec: v1alpha1.InfraSpec{Description: "another deployment", Contracts: []v1alpha1.InfraContract{{Name: "api"}, {Name: "db"}}}}
		if err := env.Client.Create(context.Background(), inf); err != nil {
			t.Fatal(err)
		}
	}
	inf := &v1alpha1.Infra{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bench"}, Spec: v1alpha1.InfraSpec{Description: "start"}}
	if err := env.Client.Create(context.Background(), inf); err != nil {
		t.Fatal(err)
	}
	b.waitJS("21 deployments shown", `document.querySelectorAll('article.deployment').length === 21`, 30*time.Second)

	const n = 200
	lat := make([]time.Duration, 0, n)
	for i := range n {
		want := fmt.Sprintf("bench-%d", i)
		shownAt := fmt.Sprintf(`(() => { const e = document.querySelector('article.deployment[data-name="bench"] .desc');
			return e && e.textContent === %s ? performance.timeOrigin + performance.now() : false })()`, jsString(want))
		start := time.Now()
		patch := client.RawPatch("application/merge-patch+json", []byte(fmt.Sprintf(`{"spec":{"description":%q}}`, want)))
		if err := env.Client.Patch(context.Background(), inf, patch); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
		ms, err := chromedp.Run(ctx, chromedp.Poll[float64](shownAt, chromedp.WithPollingMutation(), chromedp.WithPollingTimeout(10*time.Second)))
		cancel()
		if err != nil {
			b.fail(want+" shown", err)
		}
		lat = append(lat, time.UnixMicro(int64(ms*1000)).Sub(start))
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(float64(len(lat))*p))] }
	t.Logf("console update latency, object change to the page showing it, %d changes: p50 %s, p90 %s, p99 %s, max %s (goal p99 < 500ms)",
		n, pct(0.50).Round(100*time.Microsecond), pct(0.90).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), lat[len(lat)-1].Round(100*time.Microsecond))
}

// The console shows a tenant cluster renting a node: the Cluster Ready with no node, then,
// once a pod needs one, the pod pending, a NodeClaim going to Running, the Node Ready in the
// cluster and the pod no longer pending, live in the browser.
func TestConsole_BrowserShowsANodeJoining(t *testing.T) {
	t.Parallel()
	n := startNodeUp(t)
	consoleURL := n.up.phase(t, "console serving at ")
	b := startBrowser(t)
	b.login(consoleURL, readToken(t, n.dir))
	loadedAt := evalJS[float64](b, "window.consoleLoadedAt")

	kc := n.cluster("demo", "maxNodes: 1, scaleHold: 30s")
	cluster := `document.querySelector('article.cluster[data-name="demo"]')`
	b.waitJS("demo Ready with no node", cluster+`?.dataset.phase === "Ready" && `+cluster+`.dataset.nodes === "0" && `+
		cluster+`.querySelector('table.nodes') !== null && `+cluster+`.querySelector('tr.node') === null`, 30*time.Second)
	b.shot("cluster-ready")
	tkubectl(t, kc, spreadPod("sleeper"), "apply", "-f", "-")
	// The pod waits for a node the cluster rents: pending, its claim on the way.
	b.waitJS("sleeper pending", cluster+`?.querySelector('tr.pod[data-pod="default/sleeper"]') != null`, 60*time.Second)
	b.waitJS("a NodeClaim", cluster+`?.querySelector('tr.nodeclaim') !== null`, 60*time.Second)
	b.shot("nodeclaim")
	var nodeName string
	for name := range n.waitClaimsRunning("demo", 1, 120*time.Second) {
		nodeName = name
	}
	b.waitJS("the node "+nodeName+" Running and counted", fmt.Sprintf(`%s?.querySelector('tr.nodeclaim[data-node=%s]')?.dataset.phase === "Running" && %s.dataset.nodes === "1"`,
		cluster, jsString(nodeName), cluster), 60*time.Second)
	b.waitJS("the Node "+nodeName+" Ready and the pod no longer pending", fmt.Sprintf(`%s.querySelector('tr.node[data-node=%s]')?.dataset.ready === "True" && %s.querySelector('tr.pod') === null`,
		cluster, jsString(nodeName), cluster), 90*time.Second)
	b.shot("node-joined")
	if after := evalJS[float64](b, "window.consoleLoadedAt"); after != loadedAt {
		t.Errorf("the page was reloaded: loaded at %v, now %v", loadedAt, after)
	}
}
