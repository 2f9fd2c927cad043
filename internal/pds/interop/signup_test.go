package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"testing"
	"time"

	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/refpds"
)

type rawAnswer struct {
	status int
	header http.Header
	body   map[string]any
}

// line is what must match across servers: status, error name and message.
func (a rawAnswer) line() string {
	return fmt.Sprintf("%d %v %v", a.status, a.body["error"], a.body["message"])
}

func rawPost(t *testing.T, url, method, authz string, in any) rawAnswer {
	t.Helper()
	b, _ := json.Marshal(in)
	req, _ := http.NewRequest("POST", url+"/xrpc/"+method, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &body)
	return rawAnswer{status: resp.StatusCode, header: resp.Header, body: body}
}

func basicAdmin(pw string) string {
	req, _ := http.NewRequest("GET", "http://x", nil)
	req.SetBasicAuth("admin", pw)
	return req.Header.Get("Authorization")
}

var inviteCodeForm = regexp.MustCompile(`^localhost-[a-z2-7]{5}-[a-z2-7]{5}$`)

// signupScenario runs sign-up with and without invite codes, the admin's minting, and 31
// login attempts on one account, and returns one line per step.
func signupScenario(t *testing.T, url string) []string {
	var out []string
	add := func(step string, a rawAnswer) { out = append(out, step+": "+a.line()) }
	var desc struct {
		InviteCodeRequired bool `json:"inviteCodeRequired"`
	}
	resp, err := http.Get(url + "/xrpc/com.atproto.server.describeServer")
	if err != nil {
		t.Fatal(err)
	}
	_ = json.NewDecoder(resp.Body).Decode(&desc)
	resp.Body.Close()
	out = append(out, fmt.Sprintf("describeServer inviteCodeRequired=%v", desc.InviteCodeRequired))

	acct := map[string]any{"handle": "zed.test", "password": "zed-password", "email": "zed@example.test"}
	add("createAccount without invite", rawPost(t, url, "com.atproto.server.createAccount", "", acct))
	acct["inviteCode"] = "localhost-aaaaa-bbbbb"
	add("createAccount with a made-up invite", rawPost(t, url, "com.atproto.server.createAccount", "", acct))
	add("createInviteCode without auth", rawPost(t, url, "com.atproto.server.createInviteCode", "", map[string]any{"useCount": 1}))
	add("createInviteCode with a wrong admin password", rawPost(t, url, "com.atproto.server.createInviteCode", basicAdmin("guess"), map[string]any{"useCount": 1}))
	a := rawPost(t, url, "com.atproto.server.createInviteCode", basicAdmin(refpds.AdminPassword), map[string]any{"useCount": 1})
	code, _ := a.body["code"].(string)
	out = append(out, fmt.Sprintf("createInviteCode as admin: %d code of the reference's form %v", a.status, inviteCodeForm.MatchString(code)))
	acct["inviteCode"] = code
	a = rawPost(t, url, "com.atproto.server.createAccount", "", acct)
	out = append(out, fmt.Sprintf("createAccount with the code: %d", a.status))
	add("createAccount with the spent code", rawPost(t, url, "com.atproto.server.createAccount", "", map[string]any{"handle": "yan.test", "password": "yan-password", "email": "yan@example.test", "inviteCode": code}))
	a = rawPost(t, url, "com.atproto.server.createInviteCodes", basicAdmin(refpds.AdminPassword), map[string]any{"codeCount": 2, "useCount": 3})
	var codes struct {
		Codes []struct {
			Account string   `json:"account"`
			Codes   []string `json:"codes"`
		} `json:"codes"`
	}
	b, _ := json.Marshal(a.body)
	_ = json.Unmarshal(b, &codes)
	if len(codes.Codes) == 1 {
		out = append(out, fmt.Sprintf("createInviteCodes: %d account %s, %d codes", a.status, codes.Codes[0].Account, len(codes.Codes[0].Codes)))
	} else {
		out = append(out, fmt.Sprintf("createInviteCodes: %d %v", a.status, a.body))
	}

	login := func(pw string) rawAnswer {
		return rawPost(t, url, "com.atproto.server.createSession", "", map[string]any{"identifier": "zed.test", "password": pw})
	}
	headers := func(a rawAnswer) string {
		h := a.header
		return fmt.Sprintf("limit=%s remaining=%s policy=%s retry-after=%v", h.Get("RateLimit-Limit"), h.Get("RateLimit-Remaining"), h.Get("RateLimit-Policy"), h.Get("Retry-After") != "")
	}
	for i := range 30 {
		a := login("wrong")
		if i == 0 || i == 29 {
			add(fmt.Sprintf("createSession guess %d (%s)", i+1, headers(a)), a)
		}
	}
	a = login("zed-password")
	add(fmt.Sprintf("createSession 31, the right password (%s)", headers(a)), a)
	return out
}

// Sign-up by invite code and createSession's rate limit answer as on the reference PDS
// configured for them (PDS_INVITE_REQUIRED, PDS_RATE_LIMITS_ENABLED).
func TestInteropInvitesAndLoginLimit(t *testing.T) {
	peer := refpds.RequireWith(t, refpds.Options{InviteRequired: true, RateLimits: true})
	ours, err := pds.New(pds.Config{DataDir: t.TempDir(), AdminPassword: refpds.AdminPassword, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	want := signupScenario(t, peer.PDSURL)
	got := signupScenario(t, ours.URL())
	for i := range max(len(want), len(got)) {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("step %d:\n reference: %s\n ours:      %s", i, w, g)
		}
	}
	if t.Failed() || testing.Verbose() {
		for _, l := range want {
			t.Logf("reference: %s", l)
		}
	}
}
