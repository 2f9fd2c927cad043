package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds/refpds"
)

// blobAnswer is one step of the blob scenario as seen over HTTP: status, the headers that
// matter, and the body (JSON answers compared as parsed, blob bytes as their length).
func blobCall(t *testing.T, method, u, authz, ct string, body io.Reader, length int64) string {
	t.Helper()
	req, _ := http.NewRequest(method, u, body)
	if body != nil {
		req.ContentLength = length
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	// A fresh connection per call: a refused upload may leave its connection unusable.
	resp, err := (&http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	h := resp.Header
	if !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		var hs []string
		for _, k := range []string{"Content-Type", "Content-Length", "X-Content-Type-Options", "Content-Security-Policy", "Content-Disposition"} {
			hs = append(hs, k+"="+h.Get(k))
		}
		return fmt.Sprintf("%d %s body=%q", resp.StatusCode, strings.Join(hs, " "), raw)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Sprintf("%d unparsable %q", resp.StatusCode, raw)
	}
	norm, _ := json.Marshal(v) // keys sorted
	return fmt.Sprintf("%d %s", resp.StatusCode, norm)
}

// oversizeUpload sends an upload the server refuses before reading it all: the request is
// written while the answer is read, since a server may answer (and close) mid-body, which
// fails the write of a client that reads only after writing.
func oversizeUpload(t *testing.T, base, authz string, n int, chunked bool) string {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		framing := fmt.Sprintf("Content-Length: %d", n)
		if chunked {
			framing = "Transfer-Encoding: chunked"
		}
		fmt.Fprintf(conn, "POST /xrpc/com.atproto.repo.uploadBlob HTTP/1.1\r\nHost: localhost\r\nAuthorization: %s\r\nContent-Type: application/octet-stream\r\n%s\r\nConnection: close\r\n\r\n", authz, framing)
		chunk := make([]byte, 64<<10)
		for sent := 0; sent < n; sent += len(chunk) {
			var err error
			if chunked {
				_, err = fmt.Fprintf(conn, "%x\r\n%s\r\n", len(chunk), chunk)
			} else {
				_, err = conn.Write(chunk[:min(len(chunk), n-sent)])
			}
			if err != nil {
				return
			}
		}
		if chunked {
			_, _ = io.WriteString(conn, "0\r\n\r\n")
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "no answer: " + err.Error()
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v any
	_ = json.Unmarshal(raw, &v)
	norm, _ := json.Marshal(v)
	return fmt.Sprintf("%d %s", resp.StatusCode, norm)
}

// blobScenario runs uploads, record references, reads and listings against one PDS and
// returns one line per step. Blob and record CIDs depend only on content, so they compare
// equal across servers; the DID and revs are replaced.
func blobScenario(t *testing.T, base string, c *atclient.Client) []string {
	const coll = "app.socialweb.blobinterop"
	did := c.DID()
	authz := "Bearer " + c.Session().AccessJwt
	var out []string
	step := func(name, line string) {
		out = append(out, name+": "+strings.ReplaceAll(line, did, "<did>"))
	}
	xrpcURL := func(m string, q url.Values) string {
		return base + "/xrpc/" + m + "?" + q.Encode()
	}
	up := func(name, ct, authz string, body []byte) {
		step(name, blobCall(t, "POST", base+"/xrpc/com.atproto.repo.uploadBlob", authz, ct, bytes.NewReader(body), int64(len(body))))
	}
	blob := func(cid, mime string, size int) map[string]any {
		return map[string]any{"$type": "blob", "ref": map[string]any{"$link": cid}, "mimeType": mime, "size": size}
	}
	create := func(name, rkey string, rec map[string]any) {
		b, _ := json.Marshal(map[string]any{"repo": did, "collection": coll, "rkey": rkey, "record": rec})
		line := blobCall(t, "POST", base+"/xrpc/com.atproto.repo.createRecord", authz, "application/json", bytes.NewReader(b), int64(len(b)))
		// The commit's CID and rev differ between servers (the DID is in the commit).
		if strings.HasPrefix(line, "200 ") {
			line = "200 created"
		}
		step(name, line)
	}
	const hello, helloCID = "hello", "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
	png := "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde" +
		"\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82"

	up("upload text", "text/plain; charset=utf-8", authz, []byte(hello))
	up("upload png declared as text", "text/plain", authz, []byte(png))
	up("upload html declared as text", "text/plain", authz, []byte("<!DOCTYPE html><html></html>"))
	up("upload without session", "text/plain", "", []byte(hello))
	up("upload without content type", "", authz, []byte(hello))
	step("upload 1 byte over 5 MiB", oversizeUpload(t, base, authz, 5<<20+1, false))
	step("upload over 5 MiB, chunked", oversizeUpload(t, base, authz, 6<<20, true))

	get := func(name, cid string) {
		step(name, blobCall(t, "GET", xrpcURL("com.atproto.sync.getBlob", url.Values{"did": {did}, "cid": {cid}}), "", "", nil, 0))
	}
	get("getBlob before any record names it", helloCID)
	create("record naming a blob never uploaded", "a", map[string]any{"b": blob("bafkreiaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "text/plain", 5)})
	create("record misstating the type", "a", map[string]any{"b": blob(helloCID, "image/png", 5)})
	create("record misstating the size", "a", map[string]any{"b": blob(helloCID, "text/plain", 6)})
	create("record with a legacy blob", "a", map[string]any{"b": map[string]any{"cid": helloCID, "mimeType": "text/plain"}})
	create("record naming the blob", "a", map[string]any{"b": blob(helloCID, "text/plain", 5)})
	get("getBlob", helloCID)
	get("getBlob with a bad cid", "notacid")
	step("getBlob of an unknown repo", blobCall(t, "GET", xrpcURL("com.atproto.sync.getBlob", url.Values{"did": {"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"}, "cid": {helloCID}}), "", "", nil, 0))
	step("getBlob without cid", blobCall(t, "GET", xrpcURL("com.atproto.sync.getBlob", url.Values{"did": {did}}), "", "", nil, 0))
	list := func(name string, q url.Values) {
		q.Set("did", did)
		step(name, blobCall(t, "GET", xrpcURL("com.atproto.sync.listBlobs", q), "", "", nil, 0))
	}
	list("listBlobs", url.Values{})
	list("listBlobs limit 0", url.Values{"limit": {"0"}})
	list("listBlobs limit 1001", url.Values{"limit": {"1001"}})
	list("listBlobs bad since", url.Values{"since": {"zzzzzzzzzzzzz"}})
	step("listMissingBlobs", blobCall(t, "GET", xrpcURL("com.atproto.repo.listMissingBlobs", url.Values{}), authz, "", nil, 0))
	step("listMissingBlobs without session", blobCall(t, "GET", xrpcURL("com.atproto.repo.listMissingBlobs", url.Values{}), "", "", nil, 0))
	if _, err := c.DeleteRecord(context.Background(), coll, "a", nil); err != nil {
		t.Fatal(err)
	}
	get("getBlob after its record went", helloCID)
	list("listBlobs after its record went", url.Values{})
	return out
}

func TestInteropBlobs(t *testing.T) {
	peer := refpds.Require(t)
	ctx := context.Background()
	ref := atclient.New(peer.PDSURL)
	if _, err := ref.CreateAccount(ctx, "blobs.test", "blobs-pw", "blobs@example.test"); err != nil {
		t.Fatal(err)
	}
	want := blobScenario(t, peer.PDSURL, ref)

	ours := startOurs(t)
	oc := atclient.New(ours.URL())
	if _, err := oc.CreateAccount(ctx, "blobs.test", "blobs-pw", "blobs@example.test"); err != nil {
		t.Fatal(err)
	}
	got := blobScenario(t, ours.URL(), oc)
	for i := range max(len(want), len(got)) {
		if w, g := at(want, i), at(got, i); w != g {
			t.Errorf("step %d:\n reference: %s\n ours:      %s", i, w, g)
		}
	}
	if t.Failed() || testing.Verbose() {
		for _, l := range want {
			t.Logf("reference: %s", l)
		}
	}
}
