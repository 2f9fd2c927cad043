package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/gorilla/websocket"

	"socialweb.computer/internal/app"
	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/substrate/substratetest"
)

// relayBin is indigo's relay (cmd/relay), built once per run at the indigo version go.mod
// requires.
var relayBin = builtOnce{prefix: "socialweb-e2e-relay-"}

// relayBinary builds github.com/bluesky-social/indigo/cmd/relay in a module of its own that
// requires indigo at this module's version: the relay is built with the dependency versions
// indigo names (unmodified), and this module's go.mod and go.sum are left as they are.
func relayBinary(t *testing.T) string {
	t.Helper()
	return relayBin.get(t, func(dir string) (string, error) {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/bluesky-social/indigo").Output()
		if err != nil {
			return "", fmt.Errorf("the indigo version in go.mod: %w", err)
		}
		version := strings.TrimSpace(string(out))
		goVersion, err := exec.Command("go", "list", "-m", "-f", "{{.GoVersion}}").Output()
		if err != nil {
			return "", fmt.Errorf("the go version in go.mod: %w", err)
		}
		mod := fmt.Sprintf("module relaybuild\n\ngo %s\n\nrequire github.com/bluesky-social/indigo %s\n", strings.TrimSpace(string(goVersion)), version)
		if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod), 0o644); err != nil {
			return "", err
		}
		path := filepath.Join(dir, "relay")
		build := exec.Command("go", "build", "-o", path, "github.com/bluesky-social/indigo/cmd/relay")
		build.Dir = dir
		build.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			return "", fmt.Errorf("building indigo's relay %s: %v\n%s", version, err, out)
		}
		return path, nil
	})
}

// Addresses inside a relay test namespace. The relay dials only public addresses
// (util/ssrf.PublicOnlyTransport refuses the reserved and documentation ranges), so these are
// from 100.128.0.0/9, outside 100.64.0.0/10, on the loopback of a namespace with no route
// out: nothing sent to them leaves the namespace.
const (
	relayPDSIP   = "100.128.0.2"
	relayRelayIP = "100.128.0.3"
)

// relayNet is a network namespace for a PDS and a relay, with a hosts file that names the
// PDS hosts (ip netns exec mounts /etc/netns/NAME/hosts over /etc/hosts).
type relayNet struct {
	substratetest.Netns
	// HTTP dials inside the namespace.
	HTTP *http.Client
	WS   *websocket.Dialer
}

// newRelayNet makes the namespace with addrs on its loopback and hosts (name -> address)
// in its hosts file; both are removed when the test ends. It skips when the host cannot make
// a namespace.
func newRelayNet(t *testing.T, addrs []string, hosts map[string]string) *relayNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a relay row makes a network namespace: needs root")
	}
	requireTool(t, "ip")
	if _, err := os.Stat("/run/netns"); err != nil {
		if out, err := exec.Command("ip", "netns", "list").CombinedOutput(); err != nil {
			t.Skipf("no network namespaces here: %v %s", err, out)
		}
	}
	ns := substratetest.NewNetns(t, "swrelay")
	// On the namespace's loopback (this kernel has no dummy links): reachable only from inside.
	ns.IP(t, "link", "set", "lo", "up")
	for _, a := range addrs {
		ns.IP(t, "addr", "add", a+"/32", "dev", "lo")
	}
	etc := filepath.Join("/etc/netns", ns.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(etc) })
	var hb strings.Builder
	hb.WriteString("127.0.0.1 localhost\n")
	for name, a := range hosts {
		fmt.Fprintf(&hb, "%s %s\n", a, name)
	}
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte(hb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// A name the hosts file lacks is asked of a server that is not there, not of the host's.
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dial := dialInNetns(ns.Path())
	return &relayNet{
		Netns: ns,
		HTTP:  &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 30 * time.Second},
		WS:    &websocket.Dialer{NetDialContext: dial, HandshakeTimeout: 10 * time.Second},
	}
}

// dialInNetns dials from a thread inside the namespace at path (substratetest.InNetns); the
// socket stays there.
func dialInNetns(path string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		var derr error
		if err := substratetest.InNetns(path, func() {
			c, derr = (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
		}); err != nil {
			return nil, err
		}
		return c, derr
	}
}

// nsProc is a process started with `ip netns exec`; its stderr (and stdout, unless read) goes
// to a log file that is printed when the test fails.
type nsProc struct {
	cmd   *exec.Cmd
	lines chan string // stdout lines, when asked for
	log   string      // path of its log file
}

func (n *relayNet) start(t *testing.T, name string, env []string, readStdout bool, argv ...string) *nsProc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = logf
	p := &nsProc{cmd: cmd, log: logPath}
	var stdout *bufio.Scanner
	if readStdout {
		r, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout = bufio.NewScanner(r)
	} else {
		cmd.Stdout = logf
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the process ends, then its log is printed.
	t.Cleanup(func() {
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			// The test's own polls of listHosts would fill the tail.
			var kept []string
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.Contains(l, "sync.listHosts") {
					kept = append(kept, l)
				}
			}
			b = []byte(strings.Join(kept, "\n"))
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("%s log (tail):\n%s", name, b)
		}
	})
	interruptAtCleanup(t, cmd)
	if stdout != nil {
		p.lines = make(chan string, 16)
		go func() {
			for stdout.Scan() {
				p.lines <- stdout.Text()
			}
			close(p.lines)
		}()
	}
	return p
}

// relayPDS is a `socialweb pds serve` in a relay namespace.
type relayPDS struct {
	url, plc      string // where the test reaches it (its listen address), its PLC
	handle, did   string
	password      string
	adminPassword string
}

// startRelayPDS runs `socialweb pds serve` in n on ip:80 with the public URL http://host and
// the relays, and reads its serving and password lines.
func (n *relayNet) startRelayPDS(t *testing.T, ip, host string, relays ...string) *relayPDS {
	t.Helper()
	return n.startRelayPDSWith(t, ip, host, nil, relays...)
}

// startRelayPDSWith is startRelayPDS with more flags of pds serve (--plc-url: PDSes sharing
// one did:plc directory, as a relay resolves every DID through one). An empty host gives no
// public URL: the PDS names its listen address, http://ip.
func (n *relayNet) startRelayPDSWith(t *testing.T, ip, host string, flags []string, relays ...string) *relayPDS {
	t.Helper()
	p := &relayPDS{url: "http://" + ip, adminPassword: "admin-" + host + ip}
	args := []string{socialwebBin, "pds", "serve", "--data-dir", t.TempDir(), "--listen", ip + ":80", "--log-level", "info"}
	if host != "" {
		args = append(args, "--public-url", "http://"+host)
	}
	args = append(args, flags...)
	for _, r := range relays {
		args = append(args, "--relay", r)
	}
	proc := n.start(t, "pds-"+host+ip, []string{app.AdminPasswordEnv + "=" + p.adminPassword}, true, args...)
	deadline := time.After(60 * time.Second)
	var seen []string
	for p.password == "" {
		select {
		case l, ok := <-proc.lines:
			if !ok {
				t.Fatalf("pds serve exited; printed %q", seen)
			}
			seen = append(seen, l)
			if _, rest, ok := strings.Cut(l, "PDS serving at "); ok {
				// "<public URL> (listening on ...) (PLC <url>); account <handle> <did>; ..."
				_, plc, _ := strings.Cut(rest, "(PLC ")
				p.plc, _, _ = strings.Cut(plc, ")")
				_, acct, _ := strings.Cut(rest, "; account ")
				f := strings.Fields(acct)
				if len(f) >= 2 {
					p.handle, p.did = f[0], strings.TrimSuffix(f[1], ";")
				}
			}
			if _, rest, ok := strings.Cut(l, "password of "); ok {
				_, pw, _ := strings.Cut(rest, ": ")
				p.password, _, _ = strings.Cut(pw, " ")
			}
		case <-deadline:
			t.Fatalf("pds serve printed no serving and password lines in 60s: %q", seen)
		}
	}
	if p.plc == "" || p.did == "" {
		t.Fatalf("serving line not understood: %q", seen)
	}
	go func() {
		for range proc.lines {
		}
	}()
	return p
}

// startRelay runs indigo's relay in n on relayRelayIP:2470 with plc as its PLC directory and
// waits until it answers.
func (n *relayNet) startRelay(t *testing.T, plc string) string {
	t.Helper()
	bin := relayBinary(t)
	dir := t.TempDir()
	n.start(t, "relay", nil, false, bin, "--plc-host", plc, "--admin-password", "relay-admin", "serve",
		"--bind", relayRelayIP+":2470", "--metrics-listen", relayRelayIP+":2471", "--allow-insecure-hosts",
		"--db-url", "sqlite://"+filepath.Join(dir, "relay.sqlite"), "--persist-dir", filepath.Join(dir, "persist"))
	u := "http://" + relayRelayIP + ":2470"
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := n.HTTP.Get(u + "/xrpc/_health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return u
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not answer /xrpc/_health in 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// relayHosts is the relay's com.atproto.sync.listHosts: hostname -> status.
func (n *relayNet) relayHosts(t *testing.T, relay string) map[string]string {
	t.Helper()
	var out struct {
		Hosts []struct {
			Hostname string `json:"hostname"`
			Status   string `json:"status"`
		} `json:"hosts"`
	}
	n.getJSON(t, relay+"/xrpc/com.atproto.sync.listHosts?limit=1000", &out)
	m := map[string]string{}
	for _, h := range out.Hosts {
		m[h.Hostname] = h.Status
	}
	return m
}

// relayRepos is the relay's com.atproto.sync.listRepos: did -> rev.
func (n *relayNet) relayRepos(t *testing.T, relay string) map[string]string {
	t.Helper()
	var out struct {
		Repos []struct {
			DID string `json:"did"`
			Rev string `json:"rev"`
		} `json:"repos"`
	}
	n.getJSON(t, relay+"/xrpc/com.atproto.sync.listRepos?limit=1000", &out)
	m := map[string]string{}
	for _, r := range out.Repos {
		m[r.DID] = r.Rev
	}
	return m
}

func (n *relayNet) getJSON(t *testing.T, u string, out any) {
	t.Helper()
	resp, err := n.HTTP.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", u, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("GET %s: %v: %s", u, err, b)
	}
}

// commitLog follows a subscribeRepos stream from cursor 0 and keeps its commits; with a
// directory it verifies each with indigo (MST inversion of the ops against the commit's
// blocks, signature against the key of the account's DID document).
type commitLog struct {
	mu      sync.Mutex
	commits []firehoseCommit
	errs    []error
}

type firehoseCommit struct {
	seq            int64
	repo, rev, cid string
	ops            int
}

func (l *commitLog) follow(ctx context.Context, host string, d *websocket.Dialer, dir identity.Directory) {
	zero := int64(0)
	c := &atclient.Consumer{Host: host, Cursor: &zero, Dialer: d, Handle: func(ev *firehose.Event) error {
		if ev.Commit == nil {
			return nil
		}
		var errs []error
		if dir != nil {
			if _, err := repo.VerifyCommitMessage(ctx, ev.Commit); err != nil {
				errs = append(errs, fmt.Errorf("seq %d %s rev %s: MST/record inversion: %w", ev.Seq, ev.Commit.Repo, ev.Commit.Rev, err))
			}
			if err := repo.VerifyCommitSignature(ctx, dir, ev.Commit); err != nil {
				errs = append(errs, fmt.Errorf("seq %d %s rev %s: signature: %w", ev.Seq, ev.Commit.Repo, ev.Commit.Rev, err))
			}
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.errs = append(l.errs, errs...)
		l.commits = append(l.commits, firehoseCommit{seq: ev.Seq, repo: ev.Commit.Repo, rev: ev.Commit.Rev, cid: ev.Commit.Commit.String(), ops: len(ev.Commit.Ops)})
		return nil
	}}
	go func() { _ = c.Run(ctx) }()
}

func (l *commitLog) snapshot() ([]firehoseCommit, []error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]firehoseCommit(nil), l.commits...), append([]error(nil), l.errs...)
}

// has reports whether the log holds the commit of repo at rev.
func (l *commitLog) has(repo, rev string) bool {
	cs, _ := l.snapshot()
	for _, c := range cs {
		if c.repo == repo && c.rev == rev {
			return true
		}
	}
	return false
}

// inviteAccount signs handle up on p over XRPC with an invite code p's admin mints, and
// returns a client logged in as it.
func inviteAccount(t *testing.T, ctx context.Context, rn *relayNet, p *relayPDS, handle, password string) *atclient.Client {
	t.Helper()
	req, _ := http.NewRequest("POST", p.url+"/xrpc/com.atproto.server.createInviteCode", strings.NewReader(`{"useCount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth("admin", p.adminPassword)
	resp, err := rn.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var invite struct {
		Code string `json:"code"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&invite)
	resp.Body.Close()
	if invite.Code == "" {
		t.Fatalf("createInviteCode on %s: %d", p.url, resp.StatusCode)
	}
	c := &atclient.Client{Host: p.url, HTTP: rn.HTTP}
	if _, err := c.CreateAccountWithInvite(ctx, handle, password, "", invite.Code); err != nil {
		t.Fatalf("createAccount of %s with an invite code on %s: %v", handle, p.url, err)
	}
	return c
}

// waitFor polls cond every 200 ms until it holds or the limit passes.
func waitFor(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
	return true
}

// The unmodified indigo relay (cmd/relay at the indigo version of go.mod) ingests a
// `socialweb pds serve` that names it with --relay: the PDS at http://pds.test (100.128.0.2:80
// in a namespace of its own, the name in the namespace's hosts file) asks the relay to crawl
// it, the relay lists pds.test as a host, subscribes to its firehose, and re-serves every
// commit the PDS emits from then on (two accounts, one created over XRPC with an invite code;
// creates, an update, a delete), each verified with indigo's repo package against the DID
// document the PDS's PLC directory serves; the relay's listRepos carries both accounts at
// their last rev.
func TestACC_RelayIngestsOurPDS(t *testing.T) {
	rn := newRelayNet(t, []string{relayPDSIP, relayRelayIP}, map[string]string{"pds.test": relayPDSIP})
	relayBinary(t) // before the PDS starts, so that its requestCrawl retries stay short
	relayURL := "http://" + relayRelayIP + ":2470"
	p := rn.startRelayPDS(t, relayPDSIP, "pds.test", relayURL)
	relay := rn.startRelay(t, p.plc)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	dir := &identity.BaseDirectory{PLCURL: p.plc, HTTPClient: *rn.HTTP, SkipHandleVerification: true}
	var pdsLog, relayLog commitLog
	pdsLog.follow(ctx, p.url, rn.WS, nil)
	relayLog.follow(ctx, relay, rn.WS, dir)

	a := &atclient.Client{Host: p.url, HTTP: rn.HTTP}
	if _, err := a.Login(ctx, p.handle, p.password); err != nil {
		t.Fatalf("login as %s: %v", p.handle, err)
	}
	// The relay subscribes to the PDS after it lists it, live (no cursor): probe records until
	// one comes out of the relay, so every commit after it was emitted while it listened.
	var first *atclient.WriteResult
	for i := 0; first == nil; i++ {
		if i == 300 {
			cs, errs := relayLog.snapshot()
			t.Fatalf("no probe record came out of the relay's subscribeRepos in 60s; relay commits %v, errors %v", cs, errs)
		}
		w, err := a.CreateRecord(ctx, "computer.socialweb.test.probe", "", map[string]any{"$type": "computer.socialweb.test.probe", "n": i})
		if err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
		if waitFor(200*time.Millisecond, func() bool { return relayLog.has(p.did, w.Commit.Rev) }) {
			first = w
		}
	}

	// requestCrawl (the PDS retries until the relay answers) made the relay subscribe; it
	// lists a host once it has had an event from it (indigo: last_seq > 0).
	var hosts map[string]string
	if !waitFor(30*time.Second, func() bool { hosts = rn.relayHosts(t, relay); return hosts["pds.test"] != "" }) {
		t.Fatalf("the relay's listHosts has no pds.test after its first relayed commit: %v", hosts)
	}
	t.Logf("relay listHosts: %v", hosts)

	// A second account, signed up over XRPC with an invite code.
	b := inviteAccount(t, ctx, rn, p, "second.test", "second-password")

	// Writes on both: creates, an update, a delete.
	const coll = "computer.socialweb.test.note"
	var last = map[string]string{}
	for i := 0; i < 5; i++ {
		for _, c := range []*atclient.Client{a, b} {
			w, err := c.CreateRecord(ctx, coll, fmt.Sprintf("n%d", i), map[string]any{"$type": coll, "text": fmt.Sprintf("note %d", i)})
			if err != nil {
				t.Fatal(err)
			}
			last[c.DID()] = w.Commit.Rev
		}
	}
	w, err := a.PutRecord(ctx, coll, "n0", map[string]any{"$type": coll, "text": "note 0, edited"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	last[p.did] = w.Commit.Rev
	cm, err := b.DeleteRecord(ctx, coll, "n1", nil)
	if err != nil {
		t.Fatal(err)
	}
	last[b.DID()] = cm.Rev

	if !waitFor(60*time.Second, func() bool { return relayLog.has(p.did, last[p.did]) && relayLog.has(b.DID(), last[b.DID()]) }) {
		t.Fatalf("the relay did not re-serve the last commits (%v) in 60s", last)
	}
	if !waitFor(30*time.Second, func() bool { return pdsLog.has(p.did, last[p.did]) && pdsLog.has(b.DID(), last[b.DID()]) }) {
		t.Fatal("the PDS's own firehose lacks the last commits")
	}

	// Every commit of the PDS from the first relayed probe on, in order, is on the relay with
	// the same commit CID, and every relayed commit verified.
	pc, _ := pdsLog.snapshot()
	rc, errs := relayLog.snapshot()
	if len(errs) > 0 {
		t.Fatalf("relayed commits that do not verify: %v", errs)
	}
	start := -1
	for i, c := range pc {
		if c.repo == p.did && c.rev == first.Commit.Rev {
			start = i
		}
	}
	if start < 0 {
		t.Fatal("the PDS's firehose lacks the first relayed probe")
	}
	want := pc[start:]
	relayed := map[string]firehoseCommit{}
	for _, c := range rc {
		relayed[c.repo+" "+c.rev] = c
	}
	var missing []string
	for _, c := range want {
		r, ok := relayed[c.repo+" "+c.rev]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("%s rev %s (PDS seq %d)", c.repo, c.rev, c.seq))
		case r.cid != c.cid:
			missing = append(missing, fmt.Sprintf("%s rev %s: relay commit %s, PDS commit %s", c.repo, c.rev, r.cid, c.cid))
		}
	}
	if len(missing) > 0 {
		t.Fatalf("commits of the PDS not re-served by the relay: %v", missing)
	}
	t.Logf("relay re-served %d commits of the PDS (of %d it sent), all verified (signature, MST inversion)", len(want), len(rc))

	repos := rn.relayRepos(t, relay)
	for did, rev := range last {
		if repos[did] != rev {
			t.Errorf("relay listRepos: %s at rev %q, want %q (all: %v)", did, repos[did], rev, repos)
		}
	}
}
