package interop

import (
	"bytes"
	"context"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds/refpds"
)

// deleteScenario drives requestAccountDelete and deleteAccount with indigo's client and
// returns one line per step and the firehose events about the account read from seq 0 after
// the deletion. token obtains the deletion token: the reference mails it (and requestAccountDelete
// succeeds), this server sends no email (its operator issues it), so that step is not compared.
func deleteScenario(ctx context.Context, t *testing.T, url string, token func(did string, self *indigo.APIClient) string) ([]string, []string) {
	t.Helper()
	a := newAccount(ctx, t, url, "kim.test", "kim-pw", "kim@example.test")
	did, c, self, anon, add := a.did, a.c, a.self, a.anon, a.add
	blob, err := comatproto.RepoUploadBlob(ctx, self, bytes.NewReader([]byte("hello")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, "app.socialweb.interop", "a", map[string]any{"b": blob.Blob}, nil); err != nil {
		t.Fatal(err)
	}
	blobCID := blob.Blob.Ref.String()

	del := func(step string, in map[string]any) {
		add(step, nil, anon.Post(ctx, "com.atproto.server.deleteAccount", in, nil))
	}
	add("requestAccountDelete (anonymous)", nil, comatproto.ServerRequestAccountDelete(ctx, anon))
	del("deleteAccount without token", map[string]any{"did": did, "password": "kim-pw"})
	del("deleteAccount of an unknown DID", map[string]any{"did": "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "password": "kim-pw", "token": "AAAAA-AAAAA"})
	del("deleteAccount with a wrong password", map[string]any{"did": did, "password": "nope", "token": "AAAAA-AAAAA"})
	del("deleteAccount before any token", map[string]any{"did": did, "password": "kim-pw", "token": "AAAAA-AAAAA"})
	tok := token(did, self)
	del("deleteAccount with a wrong token", map[string]any{"did": did, "password": "kim-pw", "token": "AAAAA-AAAAA"})
	del("deleteAccount", map[string]any{"did": did, "password": "kim-pw", "token": tok})
	del("deleteAccount again", map[string]any{"did": did, "password": "kim-pw", "token": tok})

	var m map[string]any
	err = anon.Get(ctx, "com.atproto.sync.getRepoStatus", map[string]any{"did": did}, &m)
	add("sync.getRepoStatus", m, err, "active", "status")
	_, err = comatproto.SyncGetRepo(ctx, anon, did, "")
	add("sync.getRepo", "car", err)
	_, err = comatproto.SyncGetBlob(ctx, anon, blobCID, did)
	add("sync.getBlob", "blob", err)
	_, err = comatproto.SyncGetLatestCommit(ctx, anon, did)
	add("sync.getLatestCommit", nil, err)
	_, err = comatproto.IdentityResolveHandle(ctx, anon, "kim.test")
	add("resolveHandle", nil, err)
	_, err = atclient.New(url).Login(ctx, "kim.test", "kim-pw")
	a.note("createSession: " + observe(err))
	_, err = atclient.New(url).CreateAccount(ctx, "kim.test", "kim-pw2", "kim2@example.test")
	a.note("createAccount with the freed handle: " + observe(err))

	evs := &events{}
	zero := int64(0)
	sub, stop := context.WithCancel(ctx)
	defer stop()
	go (&atclient.Consumer{Host: url, Cursor: &zero, Handle: evs.handle(ctx)}).Run(sub)
	var fire []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		evs.mu.Lock()
		fire = fire[:0]
		n := len(evs.evs)
		for _, ev := range evs.evs {
			if ev.DID() == did {
				fire = append(fire, eventLine(ev))
			}
		}
		evs.mu.Unlock()
		// Every event of the new account (4) and the deleted one's: all there is.
		if (len(fire) >= 1 && n >= 5) || time.Now().After(deadline) {
			break
		}
	}
	return a.out, fire
}

func TestInteropAccountDelete(t *testing.T) {
	peer := refpds.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want, wantFire := deleteScenario(ctx, t, peer.PDSURL, mailedToken(ctx, t, peer, "delete_account"))
	ours := startOurs(t)
	got, gotFire := deleteScenario(ctx, t, ours.URL(), func(did string, self *indigo.APIClient) string {
		// An account with an email address: this server says it sends no email.
		err := comatproto.ServerRequestAccountDelete(ctx, self)
		if observeIndigo(err) != "400 InvalidRequest this server sends no email: ask its operator for an account deletion token" {
			t.Errorf("requestAccountDelete: %v", err)
		}
		tok, err := ours.RequestAccountDelete(ctx, did)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	})
	compareLines(t, want, got)
	compareLines(t, wantFire, gotFire)
}
