package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"slices"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/api/agnostic"
	comatproto "github.com/bluesky-social/indigo/api/atproto"
	indigo "github.com/bluesky-social/indigo/atproto/atclient"
	"github.com/bluesky-social/indigo/atproto/atcrypto"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds/refpds"
)

// goatScenario makes the XRPC calls goat's commands make, in goat's way (its indigo client
// functions, its request bodies and paging), since goat itself cannot be installed here:
// `account login/status/check-auth/deactivate/activate/missing-blobs`, `blob upload/ls/export`,
// and `account plc recommended/request-token/sign/submit/add-rotation-key`. token stands for the
// emailed token goat's user would paste.
func goatScenario(ctx context.Context, t *testing.T, url, plcURL string, token func(did string, c *indigo.APIClient) string) []string {
	t.Helper()
	if _, err := atclient.New(url).CreateAccount(ctx, "gus.test", "gus-pw", "gus@example.test"); err != nil {
		t.Fatal(err)
	}
	// goat account login --pds-host URL -u gus.test -p gus-pw
	c, err := indigo.LoginWithPasswordHost(ctx, url, "gus.test", "gus-pw", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	did := c.AccountDID.String()
	var out []string
	add := func(step, ok string, err error) {
		line := step + ": "
		if err != nil {
			line += observeIndigo(err)
		} else {
			line += "ok " + ok
		}
		out = append(out, strings.ReplaceAll(line, did, "<did>"))
	}
	anon := indigo.NewAPIClient(url)
	status := func(step string) {
		st, err := comatproto.SyncGetRepoStatus(ctx, anon, did)
		if err != nil {
			add(step, "", err)
			return
		}
		s := ""
		if st.Status != nil {
			s = *st.Status
		}
		add(step, fmt.Sprintf("active=%v status=%s rev=%v", st.Active, s, st.Rev != nil), nil)
	}
	status("account status")
	cs, err := comatproto.ServerCheckAccountStatus(ctx, c)
	add("account check-auth", fmt.Sprintf("activated=%v validDid=%v", cs != nil && cs.Activated, cs != nil && cs.ValidDid), err)
	add("account deactivate", "", comatproto.ServerDeactivateAccount(ctx, c, &comatproto.ServerDeactivateAccount_Input{}))
	status("account status (deactivated)")
	add("account activate", "", comatproto.ServerActivateAccount(ctx, c))
	status("account status (activated)")

	// goat blob upload FILE, twice; records name them, since blob ls lists referenced blobs.
	var img bytes.Buffer
	if err := png.Encode(&img, image.NewGray(image.Rect(0, 0, 4, 4))); err != nil {
		t.Fatal(err)
	}
	files := [][]byte{img.Bytes(), []byte("plain text")}
	var cids []string
	for i, f := range files {
		res, err := comatproto.RepoUploadBlob(ctx, c, bytes.NewReader(f))
		if err != nil {
			add(fmt.Sprintf("blob upload %d", i), "", err)
			continue
		}
		add(fmt.Sprintf("blob upload %d", i), fmt.Sprintf("mimeType=%s size=%d", res.Blob.MimeType, res.Blob.Size), nil)
		cids = append(cids, res.Blob.Ref.String())
		err = c.Post(ctx, "com.atproto.repo.putRecord", map[string]any{"repo": did, "collection": "app.socialweb.interop",
			"rkey": fmt.Sprintf("b%d", i), "record": map[string]any{"blob": res.Blob}}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(cids)
	// goat blob ls / blob export: listBlobs pages of 500, then getBlob each.
	var listed []string
	for cursor := ""; ; {
		res, err := comatproto.SyncListBlobs(ctx, anon, cursor, did, 500, "")
		if err != nil {
			add("blob ls", "", err)
			break
		}
		listed = append(listed, res.Cids...)
		if res.Cursor == nil || *res.Cursor == "" {
			break
		}
		cursor = *res.Cursor
	}
	slices.Sort(listed)
	add("blob ls", fmt.Sprintf("the uploaded blobs: %v", slices.Equal(listed, cids)), nil)
	same := len(listed) == len(files)
	for _, cid := range listed {
		b, err := comatproto.SyncGetBlob(ctx, anon, cid, did)
		if err != nil {
			add("blob export "+cid, "", err)
			same = false
			continue
		}
		same = same && slices.ContainsFunc(files, func(f []byte) bool { return bytes.Equal(f, b) })
	}
	add("blob export", fmt.Sprintf("the uploaded bytes: %v", same), nil)
	missing, err := comatproto.RepoListMissingBlobs(ctx, c, "", 500)
	add("account missing-blobs", fmt.Sprintf("%d", len(missing.Blobs)), err)

	// goat account plc recommended > plc.json; request-token; sign --token T plc.json > op.json;
	// submit op.json.
	rec, err := agnostic.IdentityGetRecommendedDidCredentials(ctx, c)
	if err != nil {
		t.Fatalf("recommended: %v", err)
	}
	var recMap map[string]any
	_ = json.Unmarshal(*rec, &recMap)
	add("account plc recommended", "{"+sortedKeys(recMap)+"}", nil)
	var body agnostic.IdentitySignPlcOperation_Input
	if err := json.Unmarshal(*rec, &body); err != nil {
		t.Fatal(err)
	}
	tok := token(did, c)
	body.Token = &tok
	signed, err := agnostic.IdentitySignPlcOperation(ctx, c, &body)
	add("account plc sign", "", err)
	if err == nil {
		add("account plc submit", "", agnostic.IdentitySubmitPlcOperation(ctx, c, &agnostic.IdentitySubmitPlcOperation_Input{Operation: signed.Operation}))
	}

	// goat account plc add-rotation-key --token T KEY: /data, the key appended, sign, submit.
	k, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := k.PublicKey()
	var data map[string]any
	plcGet(t, plcURL, did+"/data", &data)
	data["rotationKeys"] = append(data["rotationKeys"].([]any), pub.DIDKey())
	raw, _ := json.Marshal(data)
	body = agnostic.IdentitySignPlcOperation_Input{}
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	tok = token(did, c)
	body.Token = &tok
	signed, err = agnostic.IdentitySignPlcOperation(ctx, c, &body)
	add("account plc add-rotation-key: sign", "", err)
	if err == nil {
		add("account plc add-rotation-key: submit", "", agnostic.IdentitySubmitPlcOperation(ctx, c, &agnostic.IdentitySubmitPlcOperation_Input{Operation: signed.Operation}))
	}
	plcGet(t, plcURL, did+"/data", &data)
	keys, _ := data["rotationKeys"].([]any)
	out = append(out, fmt.Sprintf("rotation keys after: %d, the new one last: %v", len(keys), len(keys) > 0 && keys[len(keys)-1] == pub.DIDKey()))
	cs, err = comatproto.ServerCheckAccountStatus(ctx, c)
	add("account check-auth after", fmt.Sprintf("validDid=%v", cs != nil && cs.ValidDid), err)
	return out
}

func TestInteropGoatCalls(t *testing.T) {
	peer := refpds.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want := goatScenario(ctx, t, peer.PDSURL, peer.PLCURL, mailedToken(ctx, t, peer, "plc_operation"))
	ours := startOurs(t)
	got := goatScenario(ctx, t, ours.URL(), ours.PLCURL(), operatorPLCToken(ctx, t, ours))
	compareLines(t, want, got)
}
