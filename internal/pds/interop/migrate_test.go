package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/pds/refpds"
)

// pdsEnd is one side of a migration: the PDS's URL and how its account gets the PLC
// operation token (the reference mails it, our operator hands it over).
type pdsEnd struct {
	url      string
	plcToken func(did string, self *indigo.APIClient) string
}

// migrateScenario moves an account from one PDS to another, both on the PLC directory at
// plcURL, with the calls goat's `account migrate` makes, after the refusals of createAccount
// on the new PDS; it returns one line per step and the firehose events of the account on the
// new PDS and on the old one.
func migrateScenario(ctx context.Context, t *testing.T, from, to pdsEnd, handle, plcURL string) (steps, newFire, oldFire []string) {
	t.Helper()
	const coll = "app.socialweb.interop"
	a := newAccount(ctx, t, from.url, handle, "old-pw", "old-"+handle+"@example.test")
	other := newAccount(ctx, t, from.url, "o"+handle, "other-pw", "other-"+handle+"@example.test")
	for _, rk := range []string{"a", "b"} {
		if _, err := a.c.PutRecord(ctx, coll, rk, map[string]any{"n": rk}, nil); err != nil {
			t.Fatal(err)
		}
	}
	blob, err := comatproto.RepoUploadBlob(ctx, a.self, bytes.NewReader([]byte("hello migration")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.c.PutRecord(ctx, coll, "c", map[string]any{"b": blob.Blob}, nil); err != nil {
		t.Fatal(err)
	}

	desc, err := comatproto.ServerDescribeServer(ctx, indigo.NewAPIClient(to.url))
	if err != nil {
		t.Fatal(err)
	}
	const lxm = "com.atproto.server.createAccount"
	serviceAuth := func(who *account, aud, lxm string) string {
		tok, err := who.c.GetServiceAuth(ctx, aud, lxm, 0)
		if err != nil {
			t.Fatalf("getServiceAuth on the old PDS: %v", err)
		}
		return tok
	}
	create := func(step, token string, in map[string]any) {
		cl := indigo.NewAPIClient(to.url)
		if token != "" {
			cl.Headers.Set("Authorization", "Bearer "+token)
		}
		var out map[string]any
		err := cl.Post(ctx, lxm, in, &out)
		a.add(step, out, err)
	}
	in := map[string]any{"did": a.did, "handle": handle, "password": "new-pw", "email": "new-" + handle + "@example.test"}
	stranger, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	nsid := syntax.NSID(lxm)
	forged, err := auth.SignServiceAuth(syntax.DID(a.did), desc.Did, time.Minute, &nsid, stranger)
	if err != nil {
		t.Fatal(err)
	}
	create("createAccount with the DID and no token", "", in)
	create("createAccount with a token from another DID", serviceAuth(other, desc.Did, lxm), in)
	create("createAccount with a token for another server", serviceAuth(a, "did:web:elsewhere.test", lxm), in)
	create("createAccount with a token for another method", serviceAuth(a, desc.Did, "com.atproto.repo.createRecord"), in)
	create("createAccount with a token signed by another key", forged, in)
	create("createAccount with a session token", a.c.Session().AccessJwt, in)
	create("createAccount with a did that is not a DID", "", map[string]any{"did": "nope", "handle": handle, "password": "new-pw", "email": in["email"]})
	create("createAccount with a plcOp", serviceAuth(a, desc.Did, lxm), map[string]any{"did": a.did, "handle": handle, "password": "new-pw",
		"email": in["email"], "plcOp": map[string]any{"type": "plc_operation"}})
	// 1. goat: the account on the new PDS, with a token from the old one.
	create("createAccount", serviceAuth(a, desc.Did, lxm), in)
	create("createAccount of a DID already there", serviceAuth(a, desc.Did, lxm),
		map[string]any{"did": a.did, "handle": "x" + handle, "password": "new-pw", "email": "x-" + handle + "@example.test"})

	nc := atclient.New(to.url)
	ses, err := nc.Login(ctx, a.did, "new-pw")
	if err != nil {
		t.Fatalf("login on the new PDS: %v\n%s", err, strings.Join(a.out, "\n"))
	}
	newSelf := indigoSession(to.url, ses.AccessJwt)
	status := func(step string) {
		st, err := comatproto.ServerCheckAccountStatus(ctx, newSelf)
		a.add(step, st, err, "activated", "validDid", "indexedRecords", "expectedBlobs", "importedBlobs")
	}
	status("checkAccountStatus after createAccount")
	var creds map[string]any
	err = newSelf.Get(ctx, "com.atproto.identity.getRecommendedDidCredentials", nil, &creds)
	var doc plc.Data
	plcGet(t, plcURL, a.did+"/data", &doc)
	vm, _ := creds["verificationMethods"].(map[string]any)
	a.add("getRecommendedDidCredentials", fmt.Sprintf("%s a new signing key: %v", shape(creds), vm["atproto"] != doc.VerificationMethods["atproto"]), err)
	_, err = comatproto.SyncGetRepo(ctx, indigo.NewAPIClient(to.url), a.did, "")
	a.add("getRepo on the new PDS before activation", "car", err)

	// 2. The repo and the blobs.
	car, err := comatproto.SyncGetRepo(ctx, a.anon, a.did, "")
	if err != nil {
		t.Fatal(err)
	}
	a.add("importRepo", "", comatproto.RepoImportRepo(ctx, newSelf, bytes.NewReader(car)))
	status("checkAccountStatus after importRepo")
	missing, err := comatproto.RepoListMissingBlobs(ctx, newSelf, "", 100)
	if err != nil {
		t.Fatalf("listMissingBlobs: %v", err)
	}
	a.add("listMissingBlobs", fmt.Sprintf("%d", len(missing.Blobs)), nil)
	for _, m := range missing.Blobs {
		b, err := comatproto.SyncGetBlob(ctx, a.anon, m.Cid, a.did)
		if err != nil {
			t.Fatal(err)
		}
		_, err = comatproto.RepoUploadBlob(ctx, newSelf, bytes.NewReader(b))
		a.add("uploadBlob", "", err)
	}
	status("checkAccountStatus after the blobs")

	// 3. The identity: the old PDS signs what the new one recommends, the new one submits it.
	sign := map[string]any{"token": from.plcToken(a.did, a.self)}
	for k, v := range creds {
		sign[k] = v
	}
	var signed struct {
		Operation json.RawMessage `json:"operation"`
	}
	a.add("signPlcOperation on the old PDS", "", a.self.Post(ctx, "com.atproto.identity.signPlcOperation", sign, &signed))
	a.add("submitPlcOperation on the new PDS", "", newSelf.Post(ctx, "com.atproto.identity.submitPlcOperation", map[string]any{"operation": signed.Operation}, nil))
	status("checkAccountStatus after the PLC operation")

	// 4. Activation on the new PDS, deactivation on the old.
	a.add("activateAccount on the new PDS", "", comatproto.ServerActivateAccount(ctx, newSelf))
	a.add("deactivateAccount on the old PDS", "", comatproto.ServerDeactivateAccount(ctx, a.self, &comatproto.ServerDeactivateAccount_Input{}))
	status("checkAccountStatus after activation")

	// The repo is served from the new PDS, and written there under the new key.
	_, err = nc.PutRecord(ctx, coll, "d", map[string]any{"n": "d"}, nil)
	a.note("putRecord on the new PDS: " + observe(err))
	recs, _, err := nc.ListRecords(ctx, a.did, coll, 100, "", false)
	a.note("listRecords on the new PDS: " + uris(recs) + " " + observe(err))
	_, err = comatproto.SyncGetBlob(ctx, indigo.NewAPIClient(to.url), blob.Blob.Ref.String(), a.did)
	a.add("getBlob on the new PDS", "blob", err)
	head, err := comatproto.SyncGetRepo(ctx, indigo.NewAPIClient(to.url), a.did, "")
	a.add("getRepo on the new PDS", "car", err)
	if err == nil {
		a.note("the new PDS's commit verifies under the DID document's key: " + boolWord(verifyHead(ctx, t, plcURL, head)))
	}
	_, err = comatproto.SyncGetRepo(ctx, a.anon, a.did, "")
	a.add("getRepo on the old PDS", "car", err)

	// The new PDS: the submit's #identity, the activation's events and the new record's
	// #commit. The old: the account's creation, three records and its deactivation.
	newFire = follow(ctx, t, to.url).lines(a.did, 5, nil)
	oldFire = follow(ctx, t, from.url).lines(a.did, 8, nil)
	for _, l := range [][]string{newFire, oldFire} {
		for i := range l {
			l[i] = strings.ReplaceAll(l[i], handle, "<handle>")
		}
	}
	return a.out, newFire, oldFire
}

// verifyHead reports whether the commit of the repo CAR is signed with the key the DID
// document in the directory at plcURL names now.
func verifyHead(ctx context.Context, t *testing.T, plcURL string, car []byte) bool {
	commit, _, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(car))
	if err != nil {
		t.Errorf("repo of the new PDS: %v", err)
		return false
	}
	ident, err := (&identity.BaseDirectory{PLCURL: plcURL, SkipHandleVerification: true}).LookupDID(ctx, syntax.DID(commit.DID))
	if err != nil {
		t.Errorf("DID document: %v", err)
		return false
	}
	pub, err := ident.PublicKey()
	if err != nil {
		t.Errorf("DID document key: %v", err)
		return false
	}
	return commit.VerifySignature(pub) == nil
}

// An account moves from our PDS to the reference and from the reference to ours, both on
// the reference's PLC directory: every answer of the migration, and the firehose events on
// both sides, are the same either way.
func TestInteropMigrateAccount(t *testing.T) {
	peer := refpds.RequireWith(t, refpds.Options{ResolveDIDs: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ours := startOursWith(t, pds.Config{PLCURL: peer.PLCURL, ServiceDID: "did:web:ours.test"})
	ref := pdsEnd{url: peer.PDSURL, plcToken: mailedToken(ctx, t, peer, "plc_operation")}
	our := pdsEnd{url: ours.URL(), plcToken: operatorPLCToken(ctx, t, ours)}
	// want: the reference is the new PDS; got: ours is.
	want, wantNew, wantOld := migrateScenario(ctx, t, our, ref, "moe.test", peer.PLCURL)
	got, gotNew, gotOld := migrateScenario(ctx, t, ref, our, "mia.test", peer.PLCURL)
	compareLines(t, want, got)
	compareLines(t, wantNew, gotNew)
	compareLines(t, wantOld, gotOld)
}
