package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"socialweb.computer/internal/denodist"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/jail"
	"socialweb.computer/internal/substrate/substratetest"
)

// npmRegistry serves the pinned Deno's platform package on loopback, as the npm registry
// does, from the bytes npm's cache holds (hack/install-test-deps.sh fetched them with npm ci),
// and counts the requests for it.
func npmRegistry(t *testing.T) (string, *atomic.Int32) {
	t.Helper()
	pin, err := denodist.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	src := denodist.DefaultSource()
	path := pin.CachedIn(src.NPMCache)
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the pinned deno package is not in npm's cache (%v): hack/install-test-deps.sh puts it there", err)
	}
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+pin.TarballPath() {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &hits
}

// freshUser is the environment of a user who never ran socialweb: an empty HOME, no XDG dirs,
// no $SOCIALWEB_DENO, no deno on PATH, npm's registry at registry and its cache in HOME, and
// a working directory outside the module.
func freshUser(t *testing.T, registry string) (home, wd string, with func(*exec.Cmd)) {
	t.Helper()
	root := t.TempDir()
	home, wd = filepath.Join(root, "home"), filepath.Join(root, "elsewhere")
	for _, d := range []string{home, wd} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case k == "HOME" || k == deno.EnvDeno || strings.HasPrefix(k, "XDG_") || strings.HasPrefix(strings.ToLower(k), "npm_config_"):
			continue
		case k == "PATH":
			var keep []string
			for _, dir := range filepath.SplitList(v) {
				if _, err := os.Stat(filepath.Join(dir, "deno")); err != nil {
					keep = append(keep, dir)
				}
			}
			kv = "PATH=" + strings.Join(keep, string(filepath.ListSeparator))
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+home, "npm_config_registry="+registry)
	return home, wd, func(c *exec.Cmd) { c.Env, c.Dir = env, wd }
}

// readmeWalkthrough is the YAML of README.md's kubectl walk-through (its first heredoc), so
// that the row below keeps the README true.
func readmeWalkthrough(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)## A kubectl walk-through.*?cat <<'YAML' \| kubectl apply -f -\n(.*?)\nYAML\n`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md has no kubectl walk-through heredoc")
	}
	return string(m[1])
}

// TestFirstHour_InstallDepsThenUpFromAnEmptyHome: a user with an empty HOME, in a directory
// outside the module, with no deno anywhere, runs install-deps (which fetches the pinned Deno
// from the npm registry, integrity checked, into the user's cache) and then up, which finds
// it there and fetches nothing; the README's walk-through reaches a Deployed Infra whose
// guest answers.
func TestFirstHour_InstallDepsThenUpFromAnEmptyHome(t *testing.T) {
	requireTool(t, "kubectl")
	if os.Geteuid() != 0 {
		t.Skip("up runs its deno bidder only as root")
	}
	registry, hits := npmRegistry(t)
	home, _, with := freshUser(t, registry)
	deps := exec.Command(socialwebBin, "install-deps")
	with(deps)
	if out, err := deps.CombinedOutput(); err != nil {
		t.Fatalf("install-deps: %v\n%s", err, out)
	}
	if n := hits.Load(); n != 1 {
		t.Fatalf("install-deps made %d requests for the package, want 1", n)
	}
	dir := filepath.Join(t.TempDir(), "data")
	up := startUpWith(t, dir, with)
	if l := up.line(t, "host: deno guests:"); !strings.Contains(l, "ready") {
		t.Errorf("up's deno line: %q", l)
	}
	up.phase(t, "local bidder")
	if n := hits.Load(); n != 1 {
		t.Errorf("up fetched the package again (%d requests)", n)
	}
	pin, _ := denodist.Pinned()
	if _, err := os.Stat(filepath.Join(home, ".cache", "socialweb", "deno", filepath.Base(pin.Dir()), "deno")); err != nil {
		t.Errorf("deno is not in the user's cache: %v", err)
	}

	up.kubectl(t, readmeWalkthrough(t), "apply", "-f", "-")
	up.kubectl(t, "", "wait", "--for=jsonpath={.status.phase}=Staged", "--timeout=60s", "infra/web")
	up.kubectl(t, "", "patch", "infra", "web", "--type=json", "-p", `[{"op":"replace","path":"/spec/contracts/0/state","value":"Requested"}]`)
	up.kubectl(t, "", "wait", "--for=jsonpath={.status.phase}=Deployed", "--timeout=120s", "infra/web")
	port := strings.TrimSpace(up.kubectl(t, "", "get", "cc", "infra-web-api", "-o", "jsonpath={.status.guest.ports[0].hostPort}"))
	waitGuestAnswers(t, "http://127.0.0.1:"+port+"/", 30*time.Second)
	// Its jail's init (the PID 1 of the guest's PID namespace) is the small one beside the
	// binary, not socialweb re-executed.
	small := filepath.Join(filepath.Dir(socialwebBin), jail.InitBinary)
	if !slices.ContainsFunc(substratetest.Procs(filepath.Join(dir, "bidder")), func(pid int) bool {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return exe == small
	}) {
		t.Errorf("no process of the guest runs %s", small)
	}
}

// TestFirstHour_UpFetchesDenoItself: without install-deps, up fetches the pinned Deno itself
// into the user's cache and starts its deno bidder; a second start fetches nothing.
func TestFirstHour_UpFetchesDenoItself(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("up runs its deno bidder only as root")
	}
	registry, hits := npmRegistry(t)
	home, _, with := freshUser(t, registry)
	dir := filepath.Join(t.TempDir(), "data")
	up := startUpWith(t, dir, with)
	pin, _ := denodist.Pinned()
	want := filepath.Join(home, ".cache", "socialweb", "deno", pin.Version+"-"+strings.TrimPrefix(pin.Package, "@deno/"), "deno")
	if got := up.phase(t, pin.String()+" installed at"); got != want {
		t.Errorf("deno installed at %q, want %q", got, want)
	}
	up.phase(t, "local bidder")
	if n := hits.Load(); n != 1 {
		t.Errorf("%d requests for the package, want 1", n)
	}
	up.stop(t)
	startUpWith(t, dir, with).phase(t, "local bidder")
	if n := hits.Load(); n != 1 {
		t.Errorf("%d requests for the package after a restart, want still 1", n)
	}
}

// TestFirstHour_UpRefusesATamperedDeno: a registry serving other bytes under the pinned name
// installs nothing; up says why and runs without deno guests.
func TestFirstHour_UpRefusesATamperedDeno(t *testing.T) {
	pin, err := denodist.Pinned()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("#!/bin/sh\necho pwned > /tmp/pwned\n"))
	}))
	defer srv.Close()
	home, _, with := freshUser(t, srv.URL)
	up := startUpWith(t, filepath.Join(t.TempDir(), "data"), with)
	up.phase(t, "deno not provisioned:")
	up.mu.Lock()
	lines := strings.Join(up.phases, "\n")
	up.mu.Unlock()
	if !strings.Contains(lines, "is not the pinned package: integrity") {
		t.Errorf("up's phases do not say the integrity differs:\n%s", lines)
	}
	entries, _ := os.ReadDir(filepath.Join(home, ".cache", "socialweb", "deno", filepath.Base(pin.Dir())))
	if len(entries) != 0 {
		t.Errorf("a refused package left %v in the user's cache", entries)
	}
}

// TestBenchFirstHour_UpReadyOnAFreshHome: up to ready for a user with an empty HOME whose npm
// cache holds the pinned Deno package (npm fetched it before), so up unpacks it from there;
// then the same user's second start. Prints both.
func TestBenchFirstHour_UpReadyOnAFreshHome(t *testing.T) {
	benchOnly(t)
	if os.Geteuid() != 0 {
		t.Skip("up runs its deno bidder only as root")
	}
	registry, hits := npmRegistry(t)
	cache := denodist.DefaultSource().NPMCache
	_, _, with := freshUser(t, registry)
	withCache := func(c *exec.Cmd) { with(c); c.Env = append(c.Env, "npm_config_cache="+cache) }
	dir := filepath.Join(t.TempDir(), "data")
	t0 := time.Now()
	up := startUpWith(t, dir, withCache)
	first := time.Since(t0)
	from := up.phase(t, "(from")
	up.stop(t)
	t0 = time.Now()
	startUpWith(t, dir, withCache)
	second := time.Since(t0)
	if hits.Load() != 0 {
		t.Errorf("the registry was asked %d times; the package was in npm's cache", hits.Load())
	}
	t.Logf("first up on a fresh HOME to ready, deno unpacked from npm's cache (%s): %.2fs (goal < 10s)", from, first.Seconds())
	t.Logf("second up of the same user to ready: %.2fs", second.Seconds())
}
