package pds_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/plc"
)

// session logs in to url and returns an indigo client holding the access token.
func session(t *testing.T, url, ident, password string) *indigo.APIClient {
	t.Helper()
	ses, err := atclient.New(url).Login(context.Background(), ident, password)
	if err != nil {
		t.Fatalf("login %s at %s: %v", ident, url, err)
	}
	c := indigo.NewAPIClient(url)
	c.Headers.Set("Authorization", "Bearer "+ses.AccessJwt)
	return c
}

// An account moves from one of our PDSes (old) to another (next) that shares its PLC
// directory, the way goat's `account migrate` moves it: createAccount on next with the DID
// and a service-auth token minted by old, importRepo, the missing blobs, the PLC operation
// signed by old and submitted by next, activation on next and deactivation on old.
func TestMigrateAccountBetweenServers(t *testing.T) {
	ctx := context.Background()
	oldDir := t.TempDir()
	old := startPDSWith(t, pds.Config{DataDir: oldDir, ServiceDID: "did:web:old.test"})
	docOf := func(did string) *plc.Data {
		t.Helper()
		d, err := (&plc.Client{URL: old.PLCURL()}).Data(ctx, did)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	nextDir := t.TempDir()
	nextCfg := pds.Config{DataDir: nextDir, PLCURL: old.PLCURL(), ServiceDID: "did:web:next.test", OpenSignup: true}
	next := startPDSWith(t, nextCfg)

	did, err := old.CreateAccount(ctx, "mia.test", "old-pw")
	if err != nil {
		t.Fatal(err)
	}
	other, err := old.CreateAccount(ctx, "ned.test", "pw")
	if err != nil {
		t.Fatal(err)
	}
	oldSelf := session(t, old.URL(), "mia.test", "old-pw")
	for _, rk := range []string{"a", "b"} {
		if _, _, err := old.Repo(did).Create(ctx, "app.socialweb.test", rk, map[string]any{"n": rk}); err != nil {
			t.Fatal(err)
		}
	}
	blob, err := comatproto.RepoUploadBlob(ctx, oldSelf, bytes.NewReader([]byte("migrating blob")))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := old.Repo(did).Create(ctx, "app.socialweb.test", "c", map[string]any{"b": blob.Blob}); err != nil {
		t.Fatal(err)
	}

	// createAccount refusals: nothing is created by any of them.
	create := map[string]any{"did": did, "handle": "mia.test", "password": "new-pw"}
	token := func(iss, aud, lxm string) string {
		tok, err := old.ServiceAuth(ctx, iss, aud, lxm, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return "Bearer " + tok
	}
	stranger, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	lxm := syntax.NSID("com.atproto.server.createAccount")
	forged, err := auth.SignServiceAuth(syntax.DID(did), next.ServiceDID(), time.Minute, &lxm, stranger)
	if err != nil {
		t.Fatal(err)
	}
	oldAccess := strings.TrimPrefix(oldSelf.Headers.Get("Authorization"), "Bearer ")
	for _, tc := range []struct {
		name, authz string
		in          map[string]any
		status      int
		want        string
	}{
		{"no token", "", create, 401, "AuthenticationRequired Missing auth to create account with did: " + did},
		{"a token from another DID", token(other, next.ServiceDID(), lxm.String()), create, 401, "AuthenticationRequired Missing auth to create account with did: " + did},
		{"a token for another server", token(did, old.ServiceDID(), lxm.String()), create, 401, "BadJwtAudience"},
		{"a token for another method", token(did, next.ServiceDID(), "com.atproto.repo.createRecord"), create, 401, "BadJwtLexiconMethod"},
		{"a token without a method", token(did, next.ServiceDID(), ""), create, 401, "BadJwtLexiconMethod"},
		{"a token signed by another key", "Bearer " + forged, create, 401, "BadJwtSignature"},
		{"a session token", "Bearer " + oldAccess, create, 401, "BadJwtType"},
		{"basic auth", basic("pw"), create, 401, "AuthenticationRequired Invalid authorization header"},
		{"a plc operation", token(did, next.ServiceDID(), lxm.String()), map[string]any{"did": did, "handle": "mia.test", "password": "new-pw", "plcOp": map[string]any{}}, 400, `InvalidRequest Unsupported input: "plcOp"`},
		{"not a DID", "", map[string]any{"did": "nope", "handle": "mia.test", "password": "new-pw"}, 400, "InvalidRequest"},
	} {
		a := post(t, nil, next.URL(), "com.atproto.server.createAccount", tc.authz, tc.in)
		msg, _ := a.body["message"].(string)
		if got := a.errName() + " " + msg; a.status != tc.status || !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, a.status, got, tc.status, tc.want)
		}
	}
	if _, err := comatproto.IdentityResolveHandle(ctx, indigo.NewAPIClient(next.URL()), "mia.test"); err == nil {
		t.Fatal("a refused createAccount left an account")
	}

	// 1. The account, deactivated, with a signing key of its own.
	good := token(did, next.ServiceDID(), lxm.String())
	a := post(t, nil, next.URL(), "com.atproto.server.createAccount", good, create)
	if a.status != 200 || a.body["did"] != did || a.body["handle"] != "mia.test" || a.body["accessJwt"] == nil {
		t.Fatalf("createAccount: %d %v", a.status, a.body)
	}
	for _, k := range []string{"active", "status"} {
		if _, ok := a.body[k]; ok {
			t.Errorf("createAccount answers %s: %v", k, a.body)
		}
	}
	if again := post(t, nil, next.URL(), "com.atproto.server.createAccount", good, create); again.status != 401 || again.errName() != "JwtReplayed" {
		t.Fatalf("createAccount with a used token: %d %v", again.status, again.body)
	}
	if again := post(t, nil, next.URL(), "com.atproto.server.createAccount", token(did, next.ServiceDID(), lxm.String()),
		map[string]any{"did": did, "handle": "mia2.test", "password": "new-pw"}); again.status != 400 || again.errName() != "AlreadyExists" {
		t.Fatalf("createAccount of a DID already here: %d %v", again.status, again.body)
	}
	// A handle held here is named first, with a token or without (as the reference).
	for _, authz := range []string{token(did, next.ServiceDID(), lxm.String()), ""} {
		if again := post(t, nil, next.URL(), "com.atproto.server.createAccount", authz, create); again.status != 400 ||
			!strings.HasPrefix(again.body["message"].(string), "Handle already taken") {
			t.Fatalf("createAccount with a handle held here (token %v): %d %v", authz != "", again.status, again.body)
		}
	}
	newSelf := session(t, next.URL(), did, "new-pw")
	st, err := comatproto.ServerCheckAccountStatus(ctx, newSelf)
	if err != nil || st.Activated || st.ValidDid {
		t.Fatalf("checkAccountStatus after createAccount: %+v %v", st, err)
	}
	var creds pds.DIDCredentials
	if err := newSelf.Get(ctx, "com.atproto.identity.getRecommendedDidCredentials", nil, &creds); err != nil {
		t.Fatal(err)
	}
	data := docOf(did)
	if creds.VerificationMethods["atproto"] == data.VerificationMethods["atproto"] || creds.Services["atproto_pds"].Endpoint != next.URL() {
		t.Fatalf("recommended credentials %+v, document %+v", creds, data)
	}
	if _, err := comatproto.SyncGetRepo(ctx, indigo.NewAPIClient(next.URL()), did, ""); apiErrName(err) != "400 RepoDeactivated" {
		t.Fatalf("getRepo of the account being moved in: %v", err)
	}

	// A restart of the new PDS leaves the document, which does not name it yet, alone.
	next.Close()
	next = startPDSWith(t, nextCfg)
	newSelf.Host = next.URL()
	if err := newSelf.Get(ctx, "com.atproto.identity.getRecommendedDidCredentials", nil, &creds); err != nil {
		t.Fatal(err)
	}
	if still := docOf(did); still.Services["atproto_pds"].Endpoint != old.URL() {
		t.Fatalf("a restart of the new PDS moved the document: %+v", still)
	}

	// 2. The repo and its blobs.
	car, err := comatproto.SyncGetRepo(ctx, indigo.NewAPIClient(old.URL()), did, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := comatproto.RepoImportRepo(ctx, newSelf, bytes.NewReader(car)); err != nil {
		t.Fatal(err)
	}
	missing, err := comatproto.RepoListMissingBlobs(ctx, newSelf, "", 100)
	if err != nil || len(missing.Blobs) != 1 || missing.Blobs[0].Cid != blob.Blob.Ref.String() {
		t.Fatalf("listMissingBlobs: %+v %v", missing, err)
	}
	for _, m := range missing.Blobs {
		b, err := comatproto.SyncGetBlob(ctx, indigo.NewAPIClient(old.URL()), m.Cid, did)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := comatproto.RepoUploadBlob(ctx, newSelf, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}

	// 3. The identity: old signs what next recommends, next submits it.
	plcTok, err := old.RequestPLCOperationSignature(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	var signed struct {
		Operation map[string]any `json:"operation"`
	}
	if err := oldSelf.Post(ctx, "com.atproto.identity.signPlcOperation", map[string]any{"token": plcTok, "rotationKeys": creds.RotationKeys,
		"alsoKnownAs": creds.AlsoKnownAs, "verificationMethods": creds.VerificationMethods, "services": creds.Services}, &signed); err != nil {
		t.Fatal(err)
	}
	if err := newSelf.Post(ctx, "com.atproto.identity.submitPlcOperation", map[string]any{"operation": signed.Operation}, nil); err != nil {
		t.Fatal(err)
	}
	st, err = comatproto.ServerCheckAccountStatus(ctx, newSelf)
	if err != nil || st.Activated || !st.ValidDid || st.IndexedRecords != 3 || st.ExpectedBlobs != 1 || st.ImportedBlobs != 1 {
		t.Fatalf("checkAccountStatus before activation: %+v %v", st, err)
	}

	// 4. Activation here, deactivation there.
	if err := comatproto.ServerActivateAccount(ctx, newSelf); err != nil {
		t.Fatal(err)
	}
	if err := comatproto.ServerDeactivateAccount(ctx, oldSelf, &comatproto.ServerDeactivateAccount_Input{}); err != nil {
		t.Fatal(err)
	}

	// The repo is served from next; a new record is signed with next's key, which the DID
	// document names.
	col := &collector{}
	zero := int64(0)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	col.run(fctx, next.URL(), next.Directory(), &zero)
	c := atclient.New(next.URL())
	if _, err := c.Login(ctx, "mia.test", "new-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, "app.socialweb.test", "d", map[string]any{"n": "d"}, nil); err != nil {
		t.Fatal(err)
	}
	recs, _, err := c.ListRecords(ctx, did, "app.socialweb.test", 10, "", false)
	if err != nil || len(recs) != 4 {
		t.Fatalf("records on the new PDS: %v %v", recs, err)
	}
	if got := strings.Join(accountEvents(t, next, did, 5), " "); got != "#identity account:true #identity #sync #commit" {
		t.Fatalf("events of the new PDS: %s", got)
	}
	col.waitDID(t, did, 5)
	if _, err := comatproto.SyncGetRepo(ctx, indigo.NewAPIClient(old.URL()), did, ""); apiErrName(err) != "400 RepoDeactivated" {
		t.Fatalf("getRepo on the old PDS: %v", err)
	}

	// A restart of the old PDS leaves the document, which names next now, alone.
	old.Close()
	old = startPDSWith(t, pds.Config{DataDir: oldDir, ServiceDID: "did:web:old.test"})
	if still := docOf(did); still.Services["atproto_pds"].Endpoint != next.URL() {
		t.Fatalf("a restart of the old PDS moved the document back: %+v", still)
	}
}
