package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "socialweb.computer/api/v1alpha1"
	"socialweb.computer/internal/atclient"
	mk "socialweb.computer/internal/atproto/market"
	"socialweb.computer/internal/controllers/computecontract"
	"socialweb.computer/internal/infra"
	"socialweb.computer/internal/market/bidder"
	"socialweb.computer/internal/market/feed"
	"socialweb.computer/internal/substrate/deno"
	"socialweb.computer/internal/substrate/substratetest"
	"socialweb.computer/internal/testenv"
)

// Addresses of the second and third PDS of a market relay row (beside relayPDSIP and
// relayRelayIP, in the same range for the same reason).
const (
	relayPDS2IP = "100.128.0.4"
	relayPDS3IP = "100.128.0.5"
)

// relayMarket is three `pds serve` sharing one did:plc directory, indigo's relay crawling
// them, and an in-process API server reachable from inside the namespace: the market's
// parties run as processes there (`socialweb controllers`, `socialweb bidder`), so that
// every host name they meet (pdsN.test in DID documents) resolves through the namespace's
// hosts file.
type relayMarket struct {
	rn    *relayNet
	env   *testenv.Env
	pdses []*relayPDS
	hosts []string // public URLs, http://pdsN.test
	relay string
	// bidders are the bidder accounts: bidder i on pdses[i].
	bidders []*relayBidder
	ctrl    *nsProc
}

type relayBidder struct {
	handle, did, password string
	pds                   string // public URL of its PDS
	stateDir, guests      string
	proc                  *nsProc
}

func newRelayMarket(t *testing.T) *relayMarket {
	t.Helper()
	if _, err := deno.New(deno.Config{StateDir: t.TempDir()}); err != nil {
		substratetest.Require(t, false, "deno", "bash hack/install-deno.sh")
	}
	hosts := map[string]string{"pds1.test": relayPDSIP, "pds2.test": relayPDS2IP, "pds3.test": relayPDS3IP}
	rn := newRelayNet(t, []string{relayPDSIP, relayRelayIP, relayPDS2IP, relayPDS3IP}, hosts)
	relayBinary(t) // before the PDSes start, so that their requestCrawl retries stay short
	relayURL := "http://" + relayRelayIP + ":2470"
	m := &relayMarket{rn: rn}
	p1 := rn.startRelayPDSWith(t, relayPDSIP, "pds1.test", []string{"--account", "requester1.test"}, relayURL)
	m.relay = rn.startRelay(t, p1.plc)
	m.pdses = []*relayPDS{p1,
		rn.startRelayPDSWith(t, relayPDS2IP, "pds2.test", []string{"--account", "requester2.test", "--plc-url", p1.plc}, relayURL),
		rn.startRelayPDSWith(t, relayPDS3IP, "pds3.test", []string{"--account", "requester3.test", "--plc-url", p1.plc}, relayURL)}
	m.hosts = []string{"http://pds1.test", "http://pds2.test", "http://pds3.test"}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var relayLog commitLog
	relayLog.follow(ctx, m.relay, rn.WS, nil)
	for _, p := range m.pdses {
		c := &atclient.Client{Host: p.url, HTTP: rn.HTTP}
		if _, err := c.Login(ctx, p.handle, p.password); err != nil {
			t.Fatalf("login as %s: %v", p.handle, err)
		}
		waitRelayed(t, ctx, &relayLog, c, p.did)
	}
	for i, p := range m.pdses[:2] {
		handle := fmt.Sprintf("bidder%d.test", i+1)
		b := &relayBidder{handle: handle, password: "pw-" + handle, pds: m.hosts[i], stateDir: filepath.Join(t.TempDir(), "bidder")}
		b.guests = filepath.Join(b.stateDir, "guests")
		b.did = inviteAccount(t, ctx, rn, p, handle, b.password).DID()
		m.bidders = append(m.bidders, b)
		if sub, err := deno.New(deno.Config{StateDir: b.guests}); err == nil {
			substratetest.Cleanup(t, sub, b.guests) // no guest outlives the row
		}
	}

	m.env = testenv.Start(t, testenv.Options{})
	u, err := url.Parse(m.env.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rn.forward(t, u.Host)
	return m
}

// waitRelayed writes probe records with c until one comes out of the relay: the relay
// subscribes to a PDS live once it lists it, so the market starts after that.
func waitRelayed(t *testing.T, ctx context.Context, relayLog *commitLog, c *atclient.Client, did string) {
	t.Helper()
	for i := 0; ; i++ {
		if i == 300 {
			t.Fatalf("no probe record of %s came out of the relay in 60s", did)
		}
		w, err := c.CreateRecord(ctx, "computer.socialweb.test.probe", "", map[string]any{"$type": "computer.socialweb.test.probe", "n": i})
		if err != nil {
			t.Fatalf("probe %d of %s: %v", i, did, err)
		}
		if waitFor(200*time.Millisecond, func() bool { return relayLog.has(did, w.Commit.Rev) }) {
			return
		}
	}
}

// forward listens on addr inside the namespace and carries each connection to addr in the
// test's own: a process inside reaches the in-process API server at the address (and so
// with the certificate) its kubeconfig names.
func (n *relayNet) forward(t *testing.T, addr string) {
	t.Helper()
	var ln net.Listener
	var lerr error
	n.In(t, func() { ln, lerr = net.Listen("tcp", addr) })
	if lerr != nil {
		t.Fatalf("listening on %s in the namespace: %v", addr, lerr)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
}

// startRequester runs `socialweb controllers` in the namespace against the API server,
// following follow (a relay, or PDSes) besides its repos' PDSes.
func (m *relayMarket) startRequester(t *testing.T, follow ...string) {
	t.Helper()
	args := []string{socialwebBin, "controllers", "--kubeconfig", m.env.Core.KubeconfigPath, "--plc-url", m.pdses[0].plc, "--log-level", "info"}
	for _, f := range follow {
		args = append(args, "--market-follow", f)
	}
	m.ctrl = m.rn.start(t, "controllers", nil, false, args...)
}

// startBidder runs `socialweb bidder` for bidder i in the namespace, following follow besides
// its own PDS.
func (m *relayMarket) startBidder(t *testing.T, i int, follow ...string) {
	t.Helper()
	b := m.bidders[i]
	var flags []string
	for _, f := range follow {
		flags = append(flags, "--follow", f)
	}
	b.proc = m.rn.startBidder(t, b.pds, b.handle, b.password, b.stateDir, m.pdses[0].plc, flags...)
}

// startBidder runs `socialweb bidder` in the namespace for the account handle on pds, with
// its state in stateDir, DIDs resolved through plc, bidding 5, and flags besides.
func (n *relayNet) startBidder(t *testing.T, pds, handle, password, stateDir, plc string, flags ...string) *nsProc {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte(password), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{socialwebBin, "bidder", "--pds", pds, "--identifier", handle, "--password-file", pw,
		"--state-dir", stateDir, "--plc-url", plc, "--cost", "5", "--log-level", "info"}, flags...)
	// `ip netns exec` mounts a sysfs of the namespace over /sys, which hides the cgroup
	// hierarchies the deno substrate puts its guests in: they are mounted again there (the
	// same hierarchies, in this mount namespace of the process only).
	sh := append([]string{"sh", "-c", cgroupMountScript(t) + ` && exec "$@"`, "sh"}, args...)
	return n.start(t, handle, nil, false, sh...)
}

// cgroupMountScript mounts at /sys/fs/cgroup what this process sees there: a tmpfs holding
// v1 hierarchies (each mounted again by its options) or a cgroup2 root.
func cgroupMountScript(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || (f[1] != "/sys/fs/cgroup" && !strings.HasPrefix(f[1], "/sys/fs/cgroup/")) {
			continue
		}
		switch f[2] {
		case "tmpfs":
			steps = append(steps, fmt.Sprintf("mount -t tmpfs -o mode=755 cgroup %s", f[1]))
		case "cgroup", "cgroup2":
			steps = append(steps, fmt.Sprintf("mkdir -p %s && mount -t %s -o %s %s %s", f[1], f[2], f[3], f[2], f[1]))
		}
	}
	if len(steps) == 0 {
		t.Skip("no cgroup hierarchy mounted at /sys/fs/cgroup: the deno substrate cannot limit guests here")
	}
	return strings.Join(steps, " && ")
}

// stopProc interrupts p and waits for it to exit.
func stopProc(t *testing.T, p *nsProc) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop within 20s of SIGINT", p.cmd.Args)
	}
}

// relayInfra is an Infra with one deno contract, Requested, whose record lives in repo.
func relayInfra(name, repo string, bidWindowSec int) *v1alpha1.Infra {
	inf := chaosInfra(name)
	inf.Spec.Record.RepoRef.Name = repo
	inf.Spec.Contracts[0].UserData = foreverGuest
	inf.Spec.Contracts[0].PolicyArgs["bidWindowSec"] = fmt.Sprint(bidWindowSec)
	return inf
}

// records lists coll of did on the PDS at host (its listen URL).
func (m *relayMarket) records(t *testing.T, host, did, coll string) []atclient.Record {
	t.Helper()
	c := &atclient.Client{Host: host, HTTP: m.rn.HTTP}
	var all []atclient.Record
	cursor := ""
	for {
		recs, next, err := c.ListRecords(context.Background(), did, coll, 100, cursor, false)
		if err != nil {
			t.Fatalf("listRecords %s %s on %s: %v", did, coll, host, err)
		}
		all = append(all, recs...)
		if next == "" || len(recs) == 0 {
			return all
		}
		cursor = next
	}
}

// The market through a relay (issue #22, item 5): three `pds serve` sharing one did:plc
// directory, indigo's unmodified relay crawling all three, one requester account on each
// (remote AtprotoRepos of one `socialweb controllers` that follows only the relay besides
// its repos' PDSes), two `socialweb bidder` on the first two PDSes following only the relay
// besides their own. Each requester's Infra (a deno guest) is Deployed once: one accept in
// its repo, one receipt among the bidders' repos, the winner's guest running. One bidder is
// stopped after the first deployment and started again on its state dir: it resumes the
// relay from its saved cursor (not from 0); then the requester is stopped and started again
// and resumes the relay after every offering, from the index it kept (a Secret). No bidder
// bids twice on an rfp. Every
// Infra is then released and every guest process ends.
func TestACC_MarketAcrossThreePDSesThroughARelay(t *testing.T) {
	t.Parallel()
	start := time.Now()
	m := newRelayMarket(t)
	ctx := context.Background()
	t.Logf("three PDSes and the relay ready in %s", time.Since(start).Round(time.Millisecond))
	for _, i := range []int{0, 1} {
		m.startBidder(t, i, m.relay)
	}
	m.startRequester(t, m.relay)
	for i, p := range m.pdses {
		repo := fmt.Sprintf("requester%d", i+1)
		remoteRepo(t, m.env, repo, m.hosts[i], p.handle, p.password)
		waitRepoReason(t, m.env, repo, v1alpha1.ReasonLoggedIn)
	}

	deploy := func(names ...string) {
		t.Helper()
		for _, name := range names {
			repo := "requester" + strings.TrimPrefix(name, "web")
			if err := m.env.Client.Create(ctx, relayInfra(name, repo, 3)); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range names {
			waitDeployed(t, m.env.Client, name)
		}
	}
	t0 := time.Now()
	deploy("web1")
	t.Logf("web1 Deployed through the relay in %s", time.Since(t0).Round(time.Millisecond))

	// The second bidder restarts: it saved the relay's cursor, and resumes from it.
	b := m.bidders[1]
	stopProc(t, b.proc)
	saved, err := feed.OpenCursors(filepath.Join(b.stateDir, bidder.CursorsFile))
	if err != nil {
		t.Fatal(err)
	}
	relayCursor := saved.Get(m.relay)
	if relayCursor <= 0 {
		t.Fatalf("%s saved no cursor of the relay %s: %d", b.handle, m.relay, relayCursor)
	}
	m.startBidder(t, 1, m.relay)

	// The requester restarts too, once its kept index knows both offerings: it resumes the
	// relay from the kept cursor, and knows the first bidder (which does not restart) only
	// from the index it kept.
	// keptIndex is the requester's index as its Secret holds it.
	keptIndex := func() (*computecontract.IndexSnapshot, error) {
		var sec corev1.Secret
		if err := m.env.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: computecontract.IndexSecretName}, &sec); err != nil {
			return nil, err
		}
		snap, err := computecontract.SnapshotOf(&sec)
		if err == nil && snap == nil {
			err = errors.New("the index Secret holds no snapshot")
		}
		return snap, err
	}
	testenv.Eventually(t, 20*time.Second, "the requester's kept index knows both offerings", func() (bool, error) {
		snap, err := keptIndex()
		if err != nil {
			return false, err
		}
		_, b0 := snap.Offerings[m.bidders[0].did]
		_, b1 := snap.Offerings[m.bidders[1].did]
		return b0 && b1 && snap.Cursors[feed.CursorKey(m.relay)] > 0, fmt.Errorf("cursors %v, %d offerings", snap.Cursors, len(snap.Offerings))
	})
	stopProc(t, m.ctrl)
	kept, err := keptIndex()
	if err != nil {
		t.Fatalf("the index kept at the requester's stop: %v", err)
	}
	requesterCursor := kept.Cursors[feed.CursorKey(m.relay)]
	m.startRequester(t, m.relay)

	t0 = time.Now()
	deploy("web2", "web3")
	t.Logf("web2 and web3 Deployed in %s", time.Since(t0).Round(time.Millisecond))
	// What the restarted requester keeps holds what it restored: the first bidder, which did
	// not restart, published its offering only before the kept cursor.
	testenv.Eventually(t, 10*time.Second, "the restarted requester keeps both offerings, past its restored cursor", func() (bool, error) {
		snap, err := keptIndex()
		if err != nil {
			return false, err
		}
		_, b0 := snap.Offerings[m.bidders[0].did]
		return b0 && snap.Cursors[feed.CursorKey(m.relay)] > requesterCursor,
			fmt.Errorf("offering of %s kept: %v; relay cursor %d (restored %d)", m.bidders[0].handle, b0, snap.Cursors[feed.CursorKey(m.relay)], requesterCursor)
	})
	for _, p := range []struct {
		who    string
		log    string
		cursor int64
	}{{"bidder", b.proc.log, relayCursor}, {"requester", m.ctrl.log, requesterCursor}} {
		logged, _ := os.ReadFile(p.log)
		if want := fmt.Sprintf("source=%s cursor=%d", feed.CursorKey(m.relay), p.cursor); !strings.Contains(string(logged), "following from a saved cursor") ||
			!strings.Contains(string(logged), want) {
			t.Fatalf("the restarted %s did not say it resumed the relay from %d (%q); its log:\n%s", p.who, p.cursor, want, logged)
		}
	}

	// Deployed once each: one accept, one receipt, the winner's guest; no bid twice.
	bidsOf := map[string]map[string]int{} // bidder did -> rfp uri -> bids
	receiptsOf := map[string][]string{}   // accept uri -> receipt uris
	for i, bd := range m.bidders {
		bidsOf[bd.did] = map[string]int{}
		for _, r := range m.records(t, m.pdses[i].url, bd.did, mk.BidNSID) {
			var bid mk.Bid
			if json.Unmarshal(r.Value, &bid) == nil {
				bidsOf[bd.did][bid.RFP.URI]++
			}
		}
		for _, r := range m.records(t, m.pdses[i].url, bd.did, mk.ReceiptNSID) {
			var rc mk.Receipt
			if json.Unmarshal(r.Value, &rc) == nil {
				receiptsOf[rc.Accept.URI] = append(receiptsOf[rc.Accept.URI], r.URI)
			}
		}
	}
	var winners []string
	for i, p := range m.pdses {
		name := fmt.Sprintf("web%d", i+1)
		var cc v1alpha1.ComputeContract
		if err := m.env.Client.Get(ctx, key(infra.ContractName(infra.KindInfra, name, "api")), &cc); err != nil {
			t.Fatal(err)
		}
		if cc.Status.Phase != v1alpha1.ComputeContractHeld || !strings.HasPrefix(cc.Status.RFP, "at://"+p.did+"/") {
			t.Fatalf("%s: contract %s, rfp %s, want Held with the rfp in %s", name, cc.Status.Phase, cc.Status.RFP, p.did)
		}
		accepts := 0
		for _, r := range m.records(t, p.url, p.did, mk.AcceptNSID) {
			var a mk.Accept
			if json.Unmarshal(r.Value, &a) == nil && a.RFP.URI == cc.Status.RFP {
				accepts++
			}
		}
		if accepts != 1 || len(receiptsOf[cc.Status.Accept]) != 1 || receiptsOf[cc.Status.Accept][0] != cc.Status.Receipt {
			t.Fatalf("%s: %d accepts of %s, receipts %v of %s, want one each (status receipt %s)", name, accepts, cc.Status.RFP, receiptsOf[cc.Status.Accept], cc.Status.Accept, cc.Status.Receipt)
		}
		for j, bd := range m.bidders {
			n := bidsOf[bd.did][cc.Status.RFP]
			if n > 1 {
				t.Fatalf("%s bid %d times on %s", bd.handle, n, cc.Status.RFP)
			}
			if j == 1 && i > 0 && n != 1 { // the restarted bidder, on the rfps after its restart
				t.Fatalf("the restarted %s did not bid on %s (%s)", bd.handle, cc.Status.RFP, name)
			}
			_, err := os.Stat(filepath.Join(bd.guests, bidder.GuestID(cc.Status.Accept)))
			if won := bd.did == cc.Status.Winner; won == errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s: guest of %s in %s: %v (winner %s)", name, cc.Status.Accept, bd.guests, err, cc.Status.Winner)
			}
		}
		winners = append(winners, cc.Status.Winner)
	}
	t.Logf("winners %v", winners)

	for i := range m.pdses {
		name := fmt.Sprintf("web%d", i+1)
		editInfra(t, m.env, name, func(inf *v1alpha1.Infra) { inf.Spec.Contracts[0].State = v1alpha1.ContractReleased })
	}
	for i := range m.pdses {
		name := fmt.Sprintf("web%d", i+1)
		waitInfra(t, m.env, name, "Released", func(inf *v1alpha1.Infra) bool { return inf.Status.Phase == v1alpha1.InfraReleased })
	}
	for _, bd := range m.bidders {
		waitNoProcs(t, bd.guests)
	}
	t.Logf("row done in %s", time.Since(start).Round(time.Millisecond))
}

// TestBench_MarketRelayOverhead measures an Infra's Requested -> Deployed with the parties
// following indigo's relay against the same with them following the PDSes directly, in one
// run over the same three PDSes (SOCIALWEB_BENCH=1): n deployments one after another in
// each mode, p50 and p99 of each and the difference of the p50s (goal: < 100 ms).
func TestBench_MarketRelayOverhead(t *testing.T) {
	benchOnly(t)
	n := 10
	if v := os.Getenv("SOCIALWEB_BENCH_N"); v != "" {
		fmt.Sscan(v, &n)
	}
	m := newRelayMarket(t)
	ctx := context.Background()
	for i, p := range m.pdses {
		repo := fmt.Sprintf("requester%d", i+1)
		remoteRepo(t, m.env, repo, m.hosts[i], p.handle, p.password)
	}
	// bidderFollows(i) are what bidder i follows besides its own PDS.
	run := func(mode string, requesterFollows []string, bidderFollows func(i int) []string) []time.Duration {
		t.Helper()
		for i := range m.bidders {
			m.startBidder(t, i, bidderFollows(i)...)
		}
		m.startRequester(t, requesterFollows...)
		for i := range m.pdses {
			waitRepoReason(t, m.env, fmt.Sprintf("requester%d", i+1), v1alpha1.ReasonLoggedIn)
		}
		var took []time.Duration
		for k := 0; k < n+1; k++ {
			name := fmt.Sprintf("%s%d", mode, k)
			repo := fmt.Sprintf("requester%d", k%3+1)
			t0 := time.Now()
			if err := m.env.Client.Create(ctx, relayInfra(name, repo, 1)); err != nil {
				t.Fatal(err)
			}
			waitDeployed(t, m.env.Client, name)
			if k > 0 { // the first warms the followers up
				took = append(took, time.Since(t0))
			}
			editInfra(t, m.env, name, func(inf *v1alpha1.Infra) { inf.Spec.Contracts[0].State = v1alpha1.ContractReleased })
			waitInfra(t, m.env, name, "Released", func(inf *v1alpha1.Infra) bool { return inf.Status.Phase == v1alpha1.InfraReleased })
		}
		stopProc(t, m.ctrl)
		for _, b := range m.bidders {
			stopProc(t, b.proc)
		}
		return took
	}
	direct := run("direct", m.hosts[:2], func(i int) []string {
		var others []string
		for j, h := range m.hosts {
			if j != i {
				others = append(others, h)
			}
		}
		return others
	})
	relayed := run("relay", []string{m.relay}, func(int) []string { return []string{m.relay} })
	pct := func(d []time.Duration, p float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		i := int(p*float64(len(s))+0.5) - 1
		if i < 0 {
			i = 0
		}
		if i >= len(s) {
			i = len(s) - 1
		}
		return s[i]
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	t.Logf("Requested -> Deployed, %d deployments each, bid window 1 s:", n)
	t.Logf("  direct PDS follow: p50 %s p99 %s", r(pct(direct, 0.5)), r(pct(direct, 0.99)))
	t.Logf("  through the relay: p50 %s p99 %s", r(pct(relayed, 0.5)), r(pct(relayed, 0.99)))
	t.Logf("  relay overhead at p50: %s (goal < 100ms)", r(pct(relayed, 0.5)-pct(direct, 0.5)))
}
