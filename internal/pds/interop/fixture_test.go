package interop

import (
	"context"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/firehose"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/refpds"
)

// account is what a scenario drives on one PDS: a new account, our client logged in as it,
// indigo's client with its access token and an anonymous one, and the lines the scenario
// records, its DID written <did> so that the lines of two servers compare.
type account struct {
	did  string
	c    *atclient.Client
	self *indigo.APIClient
	anon *indigo.APIClient
	out  []string
}

// newAccount signs up handle on the PDS at url (open sign-up) and logs in as it.
func newAccount(ctx context.Context, t *testing.T, url, handle, password, email string) *account {
	t.Helper()
	c := atclient.New(url)
	ses, err := c.CreateAccount(ctx, handle, password, email)
	if err != nil {
		t.Fatalf("createAccount %s at %s: %v", handle, url, err)
	}
	return &account{did: ses.DID, c: c, self: indigoSession(url, ses.AccessJwt), anon: indigo.NewAPIClient(url)}
}

// indigoSession is indigo's client for url with an access token.
func indigoSession(url, access string) *indigo.APIClient {
	c := indigo.NewAPIClient(url)
	c.Headers.Set("Authorization", "Bearer "+access)
	return c
}

// add records a step: the refusal, or "ok" and the answer (a string as it is, anything else
// as its shape, the values of the keys in keep shown).
func (a *account) add(step string, v any, err error, keep ...string) {
	line := step + ": "
	switch s, isString := v.(string); {
	case err != nil:
		line += observeIndigo(err)
	case isString:
		line += strings.TrimSpace("ok " + s)
	default:
		line += "ok " + shape(v, keep...)
	}
	a.note(line)
}

// note records a line as it is, but for the DID.
func (a *account) note(line string) {
	a.out = append(a.out, strings.ReplaceAll(line, a.did, "<did>"))
}

// follow reads the firehose of the PDS at url from seq 0 until the test ends.
func follow(ctx context.Context, t *testing.T, url string) *events {
	evs := &events{}
	zero := int64(0)
	sub, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go (&atclient.Consumer{Host: url, Cursor: &zero, Handle: evs.handle(ctx)}).Run(sub)
	return evs
}

// lines waits up to 15 s for n events of did that keep accepts (nil: every one) and renders
// them with eventLine; fewer after the wait.
func (e *events) lines(did string, n int, keep func(*firehose.Event) bool) []string {
	var out []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		e.mu.Lock()
		out = out[:0]
		for _, ev := range e.evs {
			if ev.DID() == did && (keep == nil || keep(ev)) {
				out = append(out, eventLine(ev))
			}
		}
		e.mu.Unlock()
		if len(out) >= n || time.Now().After(deadline) {
			return out
		}
	}
}

// mailedToken asks the reference to mail an account a token for purpose ("plc_operation" or
// "delete_account") with the account's session, and reads it from the peer's database: its
// mail goes nowhere.
func mailedToken(ctx context.Context, t *testing.T, peer *refpds.Peer, purpose string) func(did string, self *indigo.APIClient) string {
	return func(did string, self *indigo.APIClient) string {
		t.Helper()
		var err error
		switch purpose {
		case "plc_operation":
			err = comatproto.IdentityRequestPlcOperationSignature(ctx, self)
		case "delete_account":
			err = comatproto.ServerRequestAccountDelete(ctx, self)
		}
		if err != nil {
			t.Fatalf("reference: requesting a %s token: %v", purpose, err)
		}
		tok, err := peer.EmailToken(ctx, did, purpose)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
}

// operatorPLCToken is the PLC operation token our operator hands an account of ours.
func operatorPLCToken(ctx context.Context, t *testing.T, ours *pds.Server) func(did string, _ *indigo.APIClient) string {
	return func(did string, _ *indigo.APIClient) string {
		t.Helper()
		tok, err := ours.RequestPLCOperationSignature(ctx, did)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
}
