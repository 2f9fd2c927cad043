package pds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
)

// startPDSWith starts a PDS with cfg (in a new directory unless cfg.DataDir names one) and
// closes it when the test ends.
func startPDSWith(t *testing.T, cfg pds.Config) *pds.Server {
	t.Helper()
	return pds.StartForTest(t, cfg)
}

// xrpcAnswer is one raw XRPC exchange: status, headers and the decoded body.
type xrpcAnswer struct {
	status int
	header http.Header
	body   map[string]any
}

func (a xrpcAnswer) errName() string { s, _ := a.body["error"].(string); return s }

// post sends a JSON procedure from the local address from (nil: any) with an optional
// Authorization header.
func post(t *testing.T, from net.IP, url, method, authz string, in any) xrpcAnswer {
	t.Helper()
	b, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", url+"/xrpc/"+method, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	return send(t, from, req)
}

func send(t *testing.T, from net.IP, req *http.Request) xrpcAnswer {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return xrpcAnswer{status: resp.StatusCode, header: resp.Header, body: body}
}

func basic(pw string) string {
	req, _ := http.NewRequest("GET", "http://x", nil)
	req.SetBasicAuth("admin", pw)
	return req.Header.Get("Authorization")
}

// An invite-only PDS (the default) refuses sign-up without a live code, with the reference
// PDS's names; an admin mints codes, each use is spent once, and the account they were made
// for lists them.
func TestInviteCodesGateSignup(t *testing.T) {
	ctx := context.Background()
	s := startPDSWith(t, pds.Config{AdminPassword: "admin-pass"})
	c := atclient.New(s.URL())
	var desc struct {
		InviteCodeRequired bool `json:"inviteCodeRequired"`
	}
	if err := c.Call(ctx, "com.atproto.server.describeServer", nil, nil, &desc, false); err != nil || !desc.InviteCodeRequired {
		t.Fatalf("describeServer: %+v %v", desc, err)
	}

	acct := map[string]any{"handle": "eve.test", "password": "eve-password"}
	if a := post(t, nil, s.URL(), "com.atproto.server.createAccount", "", acct); a.status != 400 || a.errName() != "InvalidInviteCode" || a.body["message"] != "No invite code provided" {
		t.Fatalf("no invite: %d %v", a.status, a.body)
	}
	acct["inviteCode"] = "localhost-aaaaa-bbbbb"
	if a := post(t, nil, s.URL(), "com.atproto.server.createAccount", "", acct); a.status != 400 || a.errName() != "InvalidInviteCode" || a.body["message"] != "Provided invite code not available" {
		t.Fatalf("made-up invite: %d %v", a.status, a.body)
	}
	if _, err := c.Login(ctx, "eve.test", "eve-password"); !atclient.IsXRPC(err, "AuthenticationRequired") {
		t.Fatalf("a refused sign-up left an account: %v", err)
	}

	// Only the admin mints codes.
	for name, authz := range map[string]string{"none": "", "wrong password": basic("guess"), "bearer": "Bearer x"} {
		if a := post(t, nil, s.URL(), "com.atproto.server.createInviteCode", authz, map[string]any{"useCount": 1}); a.status != 401 || a.errName() != "AuthenticationRequired" {
			t.Fatalf("createInviteCode with %s auth: %d %v", name, a.status, a.body)
		}
	}
	a := post(t, nil, s.URL(), "com.atproto.server.createInviteCode", basic("admin-pass"), map[string]any{"useCount": 1})
	code, _ := a.body["code"].(string)
	if a.status != 200 || len(code) != len("localhost-xxxxx-xxxxx") {
		t.Fatalf("createInviteCode: %d %v", a.status, a.body)
	}
	sess, err := c.CreateAccountWithInvite(ctx, "eve.test", "eve-password", "", code)
	if err != nil {
		t.Fatalf("sign-up with a live code: %v", err)
	}
	if _, err := atclient.New(s.URL()).CreateAccountWithInvite(ctx, "mallory.test", "pw-pw-pw", "", code); !atclient.IsXRPC(err, "InvalidInviteCode") {
		t.Fatalf("a spent code was taken again: %v", err)
	}

	// Codes made for eve are hers to list, with their uses.
	a = post(t, nil, s.URL(), "com.atproto.server.createInviteCodes", basic("admin-pass"), map[string]any{"codeCount": 2, "useCount": 1, "forAccounts": []string{sess.DID}})
	if a.status != 200 {
		t.Fatalf("createInviteCodes: %d %v", a.status, a.body)
	}
	var mine struct {
		Codes []struct {
			Code       string `json:"code"`
			Available  int    `json:"available"`
			ForAccount string `json:"forAccount"`
			Uses       []any  `json:"uses"`
		} `json:"codes"`
	}
	if err := c.Call(ctx, "com.atproto.server.getAccountInviteCodes", nil, nil, &mine, true); err != nil {
		t.Fatal(err)
	}
	if len(mine.Codes) != 2 || mine.Codes[0].ForAccount != sess.DID || mine.Codes[0].Available != 1 || len(mine.Codes[0].Uses) != 0 {
		t.Fatalf("getAccountInviteCodes: %+v", mine)
	}
	if _, err := atclient.New(s.URL()).CreateAccountWithInvite(ctx, "frank.test", "pw-pw-pw", "", mine.Codes[1].Code); err != nil {
		t.Fatalf("sign-up with eve's code: %v", err)
	}
	if err := c.Call(ctx, "com.atproto.server.getAccountInviteCodes", url.Values{"includeUsed": {"true"}}, nil, &mine, true); err != nil || len(mine.Codes) != 2 {
		t.Fatalf("includeUsed: %+v %v", mine, err)
	}
	used := 0
	for _, cd := range mine.Codes {
		used += len(cd.Uses)
	}
	if used != 1 {
		t.Fatalf("uses recorded: %+v", mine)
	}
}

// With no admin password nobody mints codes over XRPC; the operator's process still can.
func TestInviteCodesWithoutAdminPassword(t *testing.T) {
	s := startPDSWith(t, pds.Config{})
	if a := post(t, nil, s.URL(), "com.atproto.server.createInviteCode", basic(""), map[string]any{"useCount": 1}); a.status != 401 || a.errName() != "AuthenticationRequired" {
		t.Fatalf("createInviteCode with an empty admin password: %d %v", a.status, a.body)
	}
	code, err := s.CreateInviteCode(context.Background(), 1, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := atclient.New(s.URL()).CreateAccountWithInvite(context.Background(), "gina.test", "pw-pw-pw", "", code); err != nil {
		t.Fatal(err)
	}
}

// Open sign-up is for loopback only: asked of a reachable address it is refused at start.
func TestOpenSignupLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0", "192.0.2.1:0", "example.test:0"} {
		_, err := pds.New(pds.Config{DataDir: t.TempDir(), Addr: addr, OpenSignup: true})
		var ose *pds.OpenSignupError
		if !errors.As(err, &ose) {
			t.Fatalf("open sign-up on %s: %v", addr, err)
		}
	}
	_, err := pds.New(pds.Config{DataDir: t.TempDir(), OpenSignup: true, PublicURL: "https://pds.example.test"})
	var ose *pds.OpenSignupError
	if !errors.As(err, &ose) {
		t.Fatalf("open sign-up published at a public URL: %v", err)
	}
	s := startPDSWith(t, pds.Config{OpenSignup: true, Addr: "127.0.0.1:0"})
	if _, err := atclient.New(s.URL()).CreateAccount(context.Background(), "hal.test", "pw-pw-pw", ""); err != nil {
		t.Fatalf("open sign-up on loopback: %v", err)
	}
}

// createSession counts every attempt per account and per client address: past either limit
// the answer is 429 RateLimitExceeded with the reference's headers, even for the right
// password, while another account and another address are unaffected.
func TestCreateSessionRateLimited(t *testing.T) {
	ctx := context.Background()
	s := startPDSWith(t, pds.Config{LoginLimits: pds.LoginLimits{AccountPoints: 5, IPPoints: 12, Window: time.Hour}})
	for _, h := range []string{"alice.test", "bob.test"} {
		if _, err := s.CreateAccount(ctx, h, h+"-password"); err != nil {
			t.Fatal(err)
		}
	}
	login := func(from net.IP, ident, pw string) xrpcAnswer {
		return post(t, from, s.URL(), "com.atproto.server.createSession", "", map[string]any{"identifier": ident, "password": pw})
	}
	one, two := net.IPv4(127, 0, 0, 1), net.IPv4(127, 0, 0, 2)
	for i := range 5 {
		a := login(one, "alice.test", fmt.Sprintf("guess-%d", i))
		if a.status != 401 || a.errName() != "AuthenticationRequired" {
			t.Fatalf("guess %d: %d %v", i, a.status, a.body)
		}
		if got := a.header.Get("RateLimit-Remaining"); got != strconv.Itoa(4-i) {
			t.Fatalf("guess %d: RateLimit-Remaining %q", i, got)
		}
	}
	// The sixth attempt is refused before the password is looked at: the right one too,
	// under the handle or the DID, from this address or another.
	did, _, _ := s.Account(ctx, "alice.test")
	for _, try := range []struct {
		from  net.IP
		ident string
	}{{one, "alice.test"}, {one, did}, {two, "ALICE.test"}} {
		a := login(try.from, try.ident, "alice.test-password")
		if a.status != 429 || a.errName() != "RateLimitExceeded" || a.body["message"] != "Rate Limit Exceeded" {
			t.Fatalf("attempt past the account limit as %s from %s: %d %v", try.ident, try.from, a.status, a.body)
		}
		h := a.header
		reset, _ := strconv.ParseInt(h.Get("RateLimit-Reset"), 10, 64)
		if h.Get("RateLimit-Limit") != "5" || h.Get("RateLimit-Remaining") != "0" || h.Get("RateLimit-Policy") != "5;w=3600" ||
			h.Get("Retry-After") == "" || reset <= time.Now().Unix() {
			t.Fatalf("rate-limit headers: %v", h)
		}
	}
	if a := login(one, "bob.test", "bob.test-password"); a.status != 200 {
		t.Fatalf("another account from the same address: %d %v", a.status, a.body)
	}

	// One address guessing across many accounts runs into the address's own limit (12: 8
	// attempts so far), and another address still logs in.
	for i := range 4 {
		if a := login(one, fmt.Sprintf("nobody%d.test", i), "x"); a.status != 401 {
			t.Fatalf("spread guess %d: %d %v", i, a.status, a.body)
		}
	}
	if a := login(one, "bob.test", "bob.test-password"); a.status != 429 || a.errName() != "RateLimitExceeded" || a.header.Get("RateLimit-Limit") != "12" {
		t.Fatalf("attempt past the address limit: %d %v %v", a.status, a.body, a.header)
	}
	if a := login(two, "bob.test", "bob.test-password"); a.status != 200 {
		t.Fatalf("another address: %d %v", a.status, a.body)
	}
}
