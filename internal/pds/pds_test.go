package pds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/serviceauth"
)

func startPDS(t *testing.T, dir string) *pds.Server {
	t.Helper()
	s, err := pds.New(pds.Config{DataDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// collector follows the firehose of a PDS and verifies every commit with indigo.
type collector struct {
	mu     sync.Mutex
	events []*firehose.Event
	errs   []error
}

func (c *collector) run(ctx context.Context, host string, dir identity.Directory, cursor *int64) {
	cons := &atclient.Consumer{Host: host, Cursor: cursor, Handle: func(ev *firehose.Event) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if ev.Commit != nil {
			if _, err := repo.VerifyCommitMessage(ctx, ev.Commit); err != nil {
				c.errs = append(c.errs, err)
			}
			if err := repo.VerifyCommitSignature(ctx, dir, ev.Commit); err != nil {
				c.errs = append(c.errs, err)
			}
		}
		c.events = append(c.events, ev)
		return nil
	}}
	go cons.Run(ctx)
}

func (c *collector) waitSeq(t *testing.T, seq int64) []*firehose.Event {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		n := len(c.events)
		var last int64
		if n > 0 {
			last = c.events[n-1].Seq
		}
		c.mu.Unlock()
		if last >= seq {
			c.mu.Lock()
			defer c.mu.Unlock()
			if len(c.errs) > 0 {
				t.Fatalf("commit verification: %v", c.errs)
			}
			return append([]*firehose.Event(nil), c.events...)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("firehose did not reach seq %d", seq)
	return nil
}

// waitDID waits for n events of did and checks that every commit verified.
func (c *collector) waitDID(t *testing.T, did string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		c.mu.Lock()
		seen := 0
		for _, ev := range c.events {
			if ev.DID() == did {
				seen++
			}
		}
		errs := c.errs
		c.mu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("commit verification: %v", errs)
		}
		if seen >= n {
			return
		}
	}
	t.Fatalf("firehose did not carry %d events of %s", n, did)
}

func TestPDSRecordsSwapsFirehoseAndRestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	s := startPDS(t, dir)
	did, err := s.CreateAccount(ctx, "alice.test", "hunter22")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	zero := int64(0)
	col.run(ctx, s.URL(), s.Directory(), &zero)

	c := atclient.New(s.URL())
	if _, err := c.Login(ctx, "alice.test", "wrong"); !atclient.IsXRPC(err, "AuthenticationRequired") {
		t.Fatalf("bad password: %v", err)
	}
	sess, err := c.Login(ctx, "alice.test", "hunter22")
	if err != nil || sess.DID != did {
		t.Fatalf("login: %v %+v", err, sess)
	}
	const coll = "app.x.y"
	put, err := c.PutRecord(ctx, coll, "a", map[string]any{"n": 1}, nil)
	if err != nil || put.Commit == nil || put.ValidationStatus != "unknown" {
		t.Fatalf("put: %v %+v", err, put)
	}
	// Same record again: no-op, no commit, even with a stale swap.
	again, err := c.PutRecord(ctx, coll, "a", map[string]any{"$type": coll, "n": 1}, &atclient.Swap{})
	if err != nil || again.Commit != nil || again.CID != put.CID {
		t.Fatalf("no-op put: %v %+v", err, again)
	}
	// swapRecord null on an existing record.
	_, err = c.PutRecord(ctx, coll, "a", map[string]any{"n": 2}, &atclient.Swap{})
	var xe *atclient.XRPCError
	if !atclient.InvalidSwap(err) || !strings.Contains(err.Error(), "Record was at "+put.CID) {
		t.Fatalf("null swap: %v", err)
	}
	// Stale swap CID.
	_, err = c.PutRecord(ctx, coll, "b", map[string]any{"n": 2}, &atclient.Swap{CID: put.CID})
	if !atclient.InvalidSwap(err) || !strings.Contains(err.Error(), "Record was at null") {
		t.Fatalf("stale swap on missing: %v", err)
	}
	upd, err := c.PutRecord(ctx, coll, "a", map[string]any{"n": 2}, &atclient.Swap{CID: put.CID})
	if err != nil || upd.Commit == nil {
		t.Fatalf("swap put: %v", err)
	}
	if _, err := c.DeleteRecord(ctx, coll, "a", &atclient.Swap{CID: put.CID}); !atclient.InvalidSwap(err) {
		t.Fatalf("stale delete swap: %v", err)
	}
	// Wrong $type and a bad rkey.
	if _, err = c.PutRecord(ctx, coll, "c", map[string]any{"$type": "app.x.z"}, nil); !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("wrong type: %v", err)
	}
	if _, err = c.PutRecord(ctx, coll, "..", map[string]any{}, nil); !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("bad rkey: %v", err)
	}
	for _, k := range []string{"c", "d", "e"} {
		if _, err := c.PutRecord(ctx, coll, k, map[string]any{"k": k}, nil); err != nil {
			t.Fatal(err)
		}
	}
	recs, cur, err := c.ListRecords(ctx, "", coll, 2, "", false)
	if err != nil || len(recs) != 2 || !strings.HasSuffix(recs[0].URI, "/e") || cur != "d" {
		t.Fatalf("list desc: %v %v %q", err, recs, cur)
	}
	recs, cur, err = c.ListRecords(ctx, "alice.test", coll, 10, cur, false)
	if err != nil || len(recs) != 2 || !strings.HasSuffix(recs[1].URI, "/a") {
		t.Fatalf("list page 2: %v %v %q", err, recs, cur)
	}
	recs, _, err = c.ListRecords(ctx, "", coll, 2, "a", true)
	if err != nil || len(recs) != 2 || !strings.HasSuffix(recs[0].URI, "/c") {
		t.Fatalf("list reverse: %v %v", err, recs)
	}
	delCommit, err := c.DeleteRecord(ctx, coll, "c", nil)
	if err != nil || delCommit == nil {
		t.Fatalf("delete: %v", err)
	}
	if nothing, err := c.DeleteRecord(ctx, coll, "c", nil); err != nil || nothing != nil {
		t.Fatalf("delete of nothing: %v %v", nothing, err)
	}
	if _, err := c.GetRecord(ctx, "", coll, "c"); !atclient.RecordNotFound(err) {
		t.Fatalf("get deleted: %v", err)
	}
	got, err := c.GetRecord(ctx, "", coll, "a")
	if err != nil || got.CID != upd.CID || !bytes.Contains(got.Value, []byte(`"n":2`)) {
		t.Fatalf("get: %v %+v", err, got)
	}
	// Writes without a session, and to someone else's repo.
	anon := atclient.New(s.URL())
	err = anon.Call(ctx, "com.atproto.repo.putRecord", nil, map[string]any{"repo": did, "collection": coll, "rkey": "z", "record": map[string]any{}}, nil, false)
	if !atclient.IsXRPC(err, "AuthMissing") {
		t.Fatalf("anonymous write: %v", err)
	}
	_ = xe

	// Service auth: a token from the PDS verifies once, then is a replay.
	tok, err := c.GetServiceAuth(ctx, "did:web:gateway.test", "computer.socialweb.k8s.apply", 0)
	if err != nil {
		t.Fatal(err)
	}
	v := serviceauth.New(serviceauth.Config{Directory: s.Directory(), Audiences: []string{"did:web:gateway.test"}})
	claims, err := v.Verify(ctx, tok, "computer.socialweb.k8s.apply")
	if err != nil || claims.Issuer != syntax.DID(did) || claims.ExpiresAt.Sub(claims.IssuedAt) != 60*time.Second {
		t.Fatalf("verify: %v %+v", err, claims)
	}
	if _, err := v.Verify(ctx, tok, "computer.socialweb.k8s.apply"); err == nil || !strings.Contains(err.Error(), "JwtReplayed") {
		t.Fatalf("replay: %v", err)
	}
	if _, err := c.GetServiceAuth(ctx, "did:web:gateway.test", "", time.Now().Add(2*time.Hour).Unix()); !atclient.IsXRPC(err, "BadExpiration") {
		t.Fatalf("long exp: %v", err)
	}
	// The in-process mint gives the same token shape, and refuses what getServiceAuth refuses.
	tok, err = s.ServiceAuth(ctx, did, "did:web:gateway.test", "computer.socialweb.k8s.apply", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if claims, err := v.Verify(ctx, tok, "computer.socialweb.k8s.apply"); err != nil || claims.Issuer != syntax.DID(did) ||
		claims.ExpiresAt.Sub(claims.IssuedAt) != 30*time.Second {
		t.Fatalf("in-process token: %v %+v", err, claims)
	}
	for _, bad := range []struct {
		aud, lxm string
		ttl      time.Duration
	}{{"not a did", "", time.Minute}, {"did:web:gateway.test", "not an nsid!", time.Minute},
		{"did:web:gateway.test", "", 2 * time.Hour}, {"did:web:gateway.test", "", 0}} {
		if _, err := s.ServiceAuth(ctx, did, bad.aud, bad.lxm, bad.ttl); err == nil {
			t.Fatalf("ServiceAuth(%q, %q, %s): no error", bad.aud, bad.lxm, bad.ttl)
		}
	}
	if _, err := s.ServiceAuth(ctx, "did:plc:nobodyhere", "did:web:gateway.test", "", time.Minute); err == nil {
		t.Fatal("ServiceAuth for an account not hosted here: no error")
	}

	// The whole repo as a CAR verifies with indigo, against the key in the DID document.
	carBytes, err := c.GetRepo(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	commit, r, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(carBytes))
	if err != nil {
		t.Fatal(err)
	}
	ident, err := s.Directory().LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := ident.PublicKey()
	if err := commit.VerifySignature(pub); err != nil {
		t.Fatalf("repo signature: %v", err)
	}
	if _, cidv, err := r.GetRecordBytes(ctx, "app.x.y", "a"); err != nil || cidv.String() != upd.CID {
		t.Fatalf("record in CAR: %v", err)
	}
	proof, err := c.SyncGetRecord(ctx, did, coll, "e")
	if err != nil {
		t.Fatal(err)
	}
	if _, pr, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(proof)); err != nil {
		t.Fatalf("proof CAR: %v", err)
	} else if _, _, err := pr.GetRecordBytes(ctx, "app.x.y", "e"); err != nil {
		t.Fatalf("record in proof: %v", err)
	}
	head, err := c.GetLatestCommit(ctx, did)
	if err != nil || head.Rev != commit.Rev {
		t.Fatalf("head: %v", err)
	}

	// Firehose: identity, account, commit, sync for the account, then one commit per write.
	evs := col.waitSeq(t, 4+1+1+3+1)
	types := []string{}
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if strings.Join(types[:4], ",") != "#identity,#account,#commit,#sync" {
		t.Fatalf("account events: %v", types)
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("seq %d at %d", ev.Seq, i)
		}
	}
	updOp := evs[5].Commit.Ops[0]
	if updOp.Action != "update" || updOp.Prev == nil || updOp.Prev.String() != put.CID {
		t.Fatalf("update op: %+v", updOp)
	}
	lastSeq := evs[len(evs)-1].Seq

	// Restart on the same data: the account, records, commits and seq survive.
	cancel()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	s2 := startPDS(t, dir)
	defer s2.Close()
	c2 := atclient.New(s2.URL())
	if _, err := c2.Login(ctx2, "alice.test", "hunter22"); err != nil {
		t.Fatal(err)
	}
	got2, err := c2.GetRecord(ctx2, "", coll, "a")
	if err != nil || got2.CID != upd.CID {
		t.Fatalf("after restart: %v", err)
	}
	head2, _ := c2.GetLatestCommit(ctx2, did)
	if head2.CID != head.CID {
		t.Fatalf("head changed over restart: %v vs %v", head2, head)
	}
	col2 := &collector{}
	col2.run(ctx2, s2.URL(), s2.Directory(), &lastSeq)
	w, err := c2.PutRecord(ctx2, coll, "f", map[string]any{"after": "restart"}, &atclient.Swap{})
	if err != nil || w.Commit == nil {
		t.Fatal(err)
	}
	// The restart moved the PDS to a new port: its DID document was updated (an #identity
	// event), then the commit.
	evs2 := col2.waitSeq(t, lastSeq+2)
	if evs2[len(evs2)-1].Type != "#commit" || evs2[0].Seq != lastSeq+1 {
		t.Fatalf("after restart events: %+v", evs2)
	}
	ident2, _ := (&identity.BaseDirectory{PLCURL: s2.PLCURL(), SkipHandleVerification: true}).LookupDID(ctx2, syntax.DID(did))
	if ident2.PDSEndpoint() != s2.URL() {
		t.Fatalf("endpoint %q, want %q", ident2.PDSEndpoint(), s2.URL())
	}
}

func TestPDSRefusalsLeaveNothing(t *testing.T) {
	ctx := context.Background()
	s := startPDS(t, t.TempDir())
	defer s.Close()
	c := atclient.New(s.URL())
	invite, err := s.CreateInviteCode(ctx, 10, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateAccountWithInvite(ctx, "bob.test", "pw", "", invite); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateAccountWithInvite(ctx, "bob.test", "pw", "", invite); !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("taken handle: %v", err)
	}
	if _, err := c.CreateAccountWithInvite(ctx, "bo.test", "pw", "", invite); !atclient.IsXRPC(err, "InvalidHandle") {
		t.Fatalf("short handle: %v", err)
	}
	if _, err := c.CreateAccountWithInvite(ctx, "bob.example.com", "pw", "", invite); !atclient.IsXRPC(err, "UnsupportedDomain") {
		t.Fatalf("domain: %v", err)
	}
	if _, err := c.Login(ctx, "bob.test", "pw"); err != nil {
		t.Fatal(err)
	}
	head, _ := c.GetLatestCommit(ctx, c.DID())
	big := strings.Repeat("x", 1100*1024)
	_, err = c.PutRecord(ctx, "app.x.y", "big", map[string]any{"s": big}, nil)
	var xe *atclient.XRPCError
	if err == nil || !(atclient.IsXRPC(err, "PayloadTooLarge")) {
		t.Fatalf("oversized: %v %v", err, xe)
	}
	if _, err := c.PutRecord(ctx, "app.x.y", "f", map[string]any{"n": 1.5}, nil); !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("float: %v", err)
	}
	// A batch with one bad write commits none of them.
	err = c.Call(ctx, "com.atproto.repo.applyWrites", nil, map[string]any{"repo": c.DID(), "writes": []any{
		map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.x.y", "rkey": "ok", "value": map[string]any{}},
		map[string]any{"$type": "com.atproto.repo.applyWrites#delete", "collection": "app.x.y", "rkey": "missing"},
	}}, nil, true)
	if !atclient.IsXRPC(err, "InvalidRequest") {
		t.Fatalf("bad batch: %v", err)
	}
	if _, err := c.GetRecord(ctx, "", "app.x.y", "ok"); !atclient.RecordNotFound(err) {
		t.Fatalf("half-written batch: %v", err)
	}
	// Stale swapCommit.
	if _, err := c.PutRecord(ctx, "app.x.y", "g", map[string]any{}, nil); err != nil {
		t.Fatal(err)
	}
	err = c.Call(ctx, "com.atproto.repo.createRecord", nil, map[string]any{"repo": c.DID(), "collection": "app.x.y", "record": map[string]any{}, "swapCommit": head.CID}, nil, true)
	if !atclient.InvalidSwap(err) || !strings.Contains(err.Error(), "Commit was at") {
		t.Fatalf("stale swapCommit: %v", err)
	}
	// Malformed bodies.
	for _, body := range []string{"not json", `{"repo": 5}`, `[]`} {
		req, _ := http.NewRequest("POST", s.URL()+"/xrpc/com.atproto.repo.putRecord", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+c.Session().AccessJwt)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error != "InvalidRequest" {
			t.Fatalf("body %q: %d %s", body, resp.StatusCode, e.Error)
		}
	}
	// Token errors.
	for _, tc := range []struct{ authz, name string }{{"", "AuthMissing"}, {"Bearer xyz", "InvalidToken"},
		{"Basic abc", "InvalidToken"}, {"Bearer " + c.Session().RefreshJwt, "InvalidToken"}} {
		req, _ := http.NewRequest("GET", s.URL()+"/xrpc/com.atproto.server.getSession", nil)
		if tc.authz != "" {
			req.Header.Set("Authorization", tc.authz)
		}
		resp, _ := http.DefaultClient.Do(req)
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if e.Error != tc.name {
			t.Fatalf("authz %q: %s", tc.authz, e.Error)
		}
	}
	// A repo param that is neither a DID nor a handle.
	for _, repo := range []string{"did:plc:", "did:", "did:PLC:abc", "bad handle", "-x.test", "at://did:plc:abc"} {
		q := url.Values{"repo": {repo}, "collection": {"app.x.y"}}
		resp, err := http.Get(s.URL() + "/xrpc/com.atproto.repo.listRecords?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		var e struct{ Error, Message string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error != "InvalidRequest" || !strings.HasPrefix(e.Message, "Invalid at-identifier") {
			t.Fatalf("repo %q: %d %s %s", repo, resp.StatusCode, e.Error, e.Message)
		}
	}
	// A method the PDS does not serve: the reference PDS's 501 answer, byte for byte.
	if resp, err := http.Get(s.URL() + "/xrpc/com.example.nothing"); err != nil {
		t.Fatal(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `{"error":"MethodNotImplemented","message":"Method Not Implemented"}` + "\n"; resp.StatusCode != 501 || string(body) != want {
			t.Fatalf("unknown method: %d %s, want 501 %s", resp.StatusCode, body, want)
		}
	}
	// Refresh, then the old refresh token is revoked.
	old := c.Session().RefreshJwt
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", s.URL()+"/xrpc/com.atproto.server.refreshSession", nil)
	req.Header.Set("Authorization", "Bearer "+old)
	resp, _ := http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("reused refresh token: %d", resp.StatusCode)
	}
	if _, err := c.GetSession(ctx); err != nil {
		t.Fatal(err)
	}
	// Handle resolution.
	var rh struct{ DID string }
	if err := c.Call(ctx, "com.atproto.identity.resolveHandle", map[string][]string{"handle": {"bob.test"}}, nil, &rh, false); err != nil || rh.DID != c.DID() {
		t.Fatalf("resolveHandle: %v %v", err, rh)
	}
	req, _ = http.NewRequest("GET", s.URL()+"/.well-known/atproto-did", nil)
	req.Host = "bob.test"
	resp, _ = http.DefaultClient.Do(req)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != c.DID() {
		t.Fatalf("well-known: %q", b)
	}
}

// A data dir restarted against a did:plc directory other than the one its accounts were
// registered with stops at its start with a reason naming both, never serving accounts whose
// DIDs resolve nowhere; started against its own again, it serves.
func TestPDSRefusesAnotherPLCDirectory(t *testing.T) {
	ctx := context.Background()
	other := startPDS(t, t.TempDir()) // its in-process directory stands for another one
	defer other.Close()
	dir := t.TempDir()
	s := startPDS(t, dir)
	if _, err := s.CreateAccount(ctx, "alice.test", "hunter22"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	moved, err := pds.New(pds.Config{DataDir: dir, PLCURL: other.PLCURL(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	err = moved.Start(ctx)
	moved.Close()
	if err == nil || !strings.Contains(err.Error(), "registered with another directory") || !strings.Contains(err.Error(), "alice.test") {
		t.Fatalf("start against another directory: %v", err)
	}
	back := startPDS(t, dir)
	back.Close()
}
