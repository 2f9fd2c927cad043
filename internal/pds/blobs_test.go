package pds_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/bluesky-social/indigo/xrpc"
	"github.com/ipfs/go-cid"

	"socialweb.computer/internal/atclient"
	"socialweb.computer/internal/pds"
)

// testClock is the injected clock blob grace periods are measured by.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type blobEnv struct {
	srv   *pds.Server
	dir   string
	clock *testClock
}

func startBlobPDS(t testing.TB, limit int64) *blobEnv {
	t.Helper()
	e := &blobEnv{dir: t.TempDir(), clock: &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
	s, err := pds.New(pds.Config{DataDir: e.dir, OpenSignup: true, BlobUploadLimit: limit, BlobSweepInterval: -1,
		Clock: e.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	e.srv = s
	return e
}

// account signs up and returns an indigo XRPC client holding its session.
func (e *blobEnv) account(t testing.TB, handle string) (*xrpc.Client, *atclient.Client) {
	t.Helper()
	ac := atclient.New(e.srv.URL())
	sess, err := ac.CreateAccount(context.Background(), handle, "blob-test-pw", "")
	if err != nil {
		t.Fatal(err)
	}
	return &xrpc.Client{Host: e.srv.URL(), Client: http.DefaultClient,
		Auth: &xrpc.AuthInfo{AccessJwt: sess.AccessJwt, RefreshJwt: sess.RefreshJwt, Did: sess.DID, Handle: handle}}, ac
}

func upload(t testing.TB, c *xrpc.Client, mime string, data []byte) *lexutil.LexBlob {
	t.Helper()
	var out comatproto.RepoUploadBlob_Output
	if err := c.Do(context.Background(), xrpc.Procedure, mime, "com.atproto.repo.uploadBlob", nil, bytes.NewReader(data), &out); err != nil {
		t.Fatalf("uploadBlob: %v", err)
	}
	return out.Blob
}

// xrpcFailure renders an indigo client error as "status name: message".
func xrpcFailure(err error) string {
	var xe *xrpc.Error
	if !errors.As(err, &xe) {
		return fmt.Sprintf("not an XRPC error: %v", err)
	}
	var body *xrpc.XRPCError
	if errors.As(xe.Wrapped, &body) {
		return fmt.Sprintf("%d %s: %s", xe.StatusCode, body.ErrStr, body.Message)
	}
	return fmt.Sprintf("%d %v", xe.StatusCode, xe.Wrapped)
}

func blobField(b *lexutil.LexBlob) map[string]any {
	return map[string]any{"$type": "blob", "ref": map[string]any{"$link": b.Ref.String()}, "mimeType": b.MimeType, "size": b.Size}
}

func createRecord(c *xrpc.Client, rkey string, record map[string]any) (*comatproto.RepoCreateRecord_Output, error) {
	var out comatproto.RepoCreateRecord_Output
	in := map[string]any{"repo": c.Auth.Did, "collection": "app.socialweb.blobtest", "rkey": rkey, "record": record}
	err := c.Do(context.Background(), xrpc.Procedure, "application/json", "com.atproto.repo.createRecord", nil, in, &out)
	return &out, err
}

// A small PNG: its type comes from its bytes, whatever the upload declares.
var tinyPNG = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde" +
	"\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")

func TestBlobUploadGetList(t *testing.T) {
	ctx := context.Background()
	e := startBlobPDS(t, 0)
	c, _ := e.account(t, "blobs.test")

	// The answer's shape, byte for byte as the reference's.
	req, _ := http.NewRequest("POST", e.srv.URL()+"/xrpc/com.atproto.repo.uploadBlob", strings.NewReader("hello"))
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	req.Header.Set("Authorization", "Bearer "+c.Auth.AccessJwt)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	const wantUpload = `{"blob":{"$type":"blob","ref":{"$link":"bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"},"mimeType":"text/plain","size":5}}`
	if resp.StatusCode != 200 || strings.TrimSpace(string(raw)) != wantUpload {
		t.Fatalf("uploadBlob: %d %s\nwant %s", resp.StatusCode, raw, wantUpload)
	}
	text := upload(t, c, "text/plain", []byte("hello"))
	png := upload(t, c, "text/plain", tinyPNG)
	if png.MimeType != "image/png" || png.Size != int64(len(tinyPNG)) || png.Ref.String()[:7] != "bafkrei" {
		t.Fatalf("png upload = %+v", png)
	}

	// Not referenced yet: not served, as in the reference.
	if _, err := comatproto.SyncGetBlob(ctx, c, text.Ref.String(), c.Auth.Did); xrpcFailure(err) != "400 InvalidRequest: Blob not found" {
		t.Fatalf("getBlob of an unreferenced upload: %s", xrpcFailure(err))
	}
	out, err := createRecord(c, "r1", map[string]any{"text": blobField(text), "imgs": []any{map[string]any{"image": blobField(png)}}})
	if err != nil {
		t.Fatalf("createRecord: %s", xrpcFailure(err))
	}

	got, err := comatproto.SyncGetBlob(ctx, c, png.Ref.String(), c.Auth.Did)
	if err != nil || !bytes.Equal(got, tinyPNG) {
		t.Fatalf("getBlob: %v %q", err, got)
	}
	for _, method := range []string{"GET", "HEAD"} {
		req, _ := http.NewRequest(method, e.srv.URL()+"/xrpc/com.atproto.sync.getBlob?did="+c.Auth.Did+"&cid="+text.Ref.String(), nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		h := resp.Header
		want := map[string]string{
			"Content-Type": "text/plain; charset=utf-8", "Content-Length": "5", "X-Content-Type-Options": "nosniff",
			"Content-Security-Policy": "default-src 'none'; sandbox",
			"Content-Disposition":     `attachment; filename="` + text.Ref.String() + `"`,
		}
		for k, v := range want {
			if h.Get(k) != v {
				t.Errorf("%s getBlob header %s = %q, want %q", method, k, h.Get(k), v)
			}
		}
		if wantBody := map[string]string{"GET": "hello", "HEAD": ""}[method]; resp.StatusCode != 200 || string(body) != wantBody {
			t.Errorf("%s getBlob: %d %q", method, resp.StatusCode, body)
		}
	}

	list, err := comatproto.SyncListBlobs(ctx, c, "", c.Auth.Did, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{text.Ref.String(), png.Ref.String()}
	if want[0] > want[1] {
		want[0], want[1] = want[1], want[0]
	}
	if fmt.Sprint(list.Cids) != fmt.Sprint(want) || list.Cursor == nil || *list.Cursor != want[1] {
		t.Fatalf("listBlobs = %v cursor %v, want %v", list.Cids, list.Cursor, want)
	}
	page, _ := comatproto.SyncListBlobs(ctx, c, "", c.Auth.Did, 1, "")
	page2, _ := comatproto.SyncListBlobs(ctx, c, *page.Cursor, c.Auth.Did, 1, "")
	if len(page.Cids) != 1 || page.Cids[0] != want[0] || len(page2.Cids) != 1 || page2.Cids[0] != want[1] {
		t.Fatalf("listBlobs pages = %v, %v", page.Cids, page2.Cids)
	}
	if l, _ := comatproto.SyncListBlobs(ctx, c, "", c.Auth.Did, 0, out.Commit.Rev); len(l.Cids) != 0 {
		t.Fatalf("listBlobs since the record's rev = %v", l.Cids)
	}
	if _, err := comatproto.SyncListBlobs(ctx, c, "", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", 0, ""); !strings.HasPrefix(xrpcFailure(err), "400 RepoNotFound") {
		t.Fatalf("listBlobs of an unknown repo: %s", xrpcFailure(err))
	}
	missing, err := comatproto.RepoListMissingBlobs(ctx, c, "", 0)
	if err != nil || len(missing.Blobs) != 0 || missing.Cursor != nil {
		t.Fatalf("listMissingBlobs = %+v, %v", missing, err)
	}
}

func TestBlobRecordRefusals(t *testing.T) {
	ctx := context.Background()
	e := startBlobPDS(t, 0)
	c, _ := e.account(t, "oona.test")
	other, _ := e.account(t, "otto.test")
	mine := upload(t, c, "text/plain", []byte("mine"))
	theirs := upload(t, other, "text/plain", []byte("theirs"))

	wrongType, wrongSize := blobField(mine), blobField(mine)
	wrongType["mimeType"] = "image/png"
	wrongSize["size"] = 5
	cases := []struct {
		name string
		blob map[string]any
		want string
	}{
		{"never uploaded", blobField(&lexutil.LexBlob{Ref: theirs.Ref, MimeType: "text/plain", Size: 1}), ""},
		{"uploaded by another account", blobField(theirs), "400 BlobNotFound: Could not find blob: " + theirs.Ref.String()},
		{"type contradicts the upload", wrongType, "400 InvalidMimeType: Referenced Mimetype does not match stored blob. Expected: text/plain, Got: image/png"},
		{"size contradicts the upload", wrongSize, "400 InvalidSize: Referenced Size does not match stored blob. Expected: 4, Got: 5"},
	}
	cases[0].want = "400 BlobNotFound: Could not find blob: " + theirs.Ref.String()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rkey := fmt.Sprintf("bad%d", i)
			_, err := createRecord(c, rkey, map[string]any{"b": tc.blob})
			if got := xrpcFailure(err); got != tc.want {
				t.Fatalf("createRecord: %s\nwant %s", got, tc.want)
			}
			_, err = comatproto.RepoGetRecord(ctx, c, "", "app.socialweb.blobtest", c.Auth.Did, rkey)
			if !strings.Contains(xrpcFailure(err), "RecordNotFound") {
				t.Fatalf("refused record is there: %s", xrpcFailure(err))
			}
		})
	}

	// One bad write refuses the whole applyWrites: the good record is not written either.
	in := map[string]any{"repo": c.Auth.Did, "writes": []any{
		map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.socialweb.blobtest", "rkey": "good", "value": map[string]any{"b": blobField(mine)}},
		map[string]any{"$type": "com.atproto.repo.applyWrites#create", "collection": "app.socialweb.blobtest", "rkey": "bad", "value": map[string]any{"b": blobField(theirs)}},
	}}
	err := c.Do(ctx, xrpc.Procedure, "application/json", "com.atproto.repo.applyWrites", nil, in, nil)
	if !strings.HasPrefix(xrpcFailure(err), "400 BlobNotFound") {
		t.Fatalf("applyWrites: %s", xrpcFailure(err))
	}
	if _, err := comatproto.RepoGetRecord(ctx, c, "", "app.socialweb.blobtest", c.Auth.Did, "good"); err == nil {
		t.Fatal("the good write of a refused applyWrites was stored")
	}
	if l, _ := comatproto.SyncListBlobs(ctx, c, "", c.Auth.Did, 0, ""); len(l.Cids) != 0 {
		t.Fatalf("refused writes left references: %v", l.Cids)
	}

	// putRecord checks the same way.
	putIn := map[string]any{"repo": c.Auth.Did, "collection": "app.socialweb.blobtest", "rkey": "p", "record": map[string]any{"b": wrongSize}}
	err = c.Do(ctx, xrpc.Procedure, "application/json", "com.atproto.repo.putRecord", nil, putIn, nil)
	if !strings.HasPrefix(xrpcFailure(err), "400 InvalidSize") {
		t.Fatalf("putRecord: %s", xrpcFailure(err))
	}
}

func TestBlobUploadRefusals(t *testing.T) {
	e := startBlobPDS(t, 1024)
	c, _ := e.account(t, "limits.test")
	post := func(body io.Reader, length int64, ct string, auth bool) (int, string) {
		req, _ := http.NewRequest("POST", e.srv.URL()+"/xrpc/com.atproto.repo.uploadBlob", body)
		req.ContentLength = length
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		if auth {
			req.Header.Set("Authorization", "Bearer "+c.Auth.AccessJwt)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var x struct{ Error, Message string }
		if resp.StatusCode != 200 {
			if err := json.Unmarshal(b, &x); err != nil {
				t.Fatalf("error answer is not an XRPC error body: %q", b)
			}
		}
		return resp.StatusCode, x.Error + ": " + x.Message
	}
	// A reader with no length: sent chunked, so only counting while streaming can stop it.
	chunked := func(n int) io.Reader { return io.MultiReader(bytes.NewReader(bytes.Repeat([]byte("x"), n))) }
	cases := []struct {
		name   string
		body   io.Reader
		length int64
		ct     string
		auth   bool
		status int
		want   string
	}{
		{"no session", strings.NewReader("x"), 1, "text/plain", false, 401, "AuthMissing: Authentication Required"},
		{"no content type", strings.NewReader("x"), 1, "", true, 400, "InvalidRequest: Request encoding (Content-Type) required but not provided"},
		{"over the limit by Content-Length", bytes.NewReader(make([]byte, 1025)), 1025, "application/octet-stream", true, 413, "PayloadTooLarge: request entity too large"},
		{"over the limit while streaming", chunked(4096), -1, "application/octet-stream", true, 413, "PayloadTooLarge: request entity too large"},
		{"at the limit", bytes.NewReader(make([]byte, 1024)), 1024, "application/octet-stream", true, 200, ": "},
		{"at the limit, streamed", chunked(1024), -1, "application/octet-stream", true, 200, ": "},
		{"empty", strings.NewReader(""), 0, "text/plain", true, 200, ": "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			if tc.name == "empty" {
				// Content-Length: 0 sent explicitly: a body, of no bytes.
				body = http.NoBody
			}
			status, got := post(body, tc.length, tc.ct, tc.auth)
			if status != tc.status || got != tc.want {
				t.Fatalf("%d %q, want %d %q", status, got, tc.status, tc.want)
			}
		})
	}
	// A body its Content-Encoding does not read is the client's fault, not the server's.
	corrupt := append([]byte("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"), bytes.Repeat([]byte{0xff}, 64)...)
	req, _ := http.NewRequest("POST", e.srv.URL()+"/xrpc/com.atproto.repo.uploadBlob", bytes.NewReader(corrupt))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set("Authorization", "Bearer "+c.Auth.AccessJwt)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 400 {
		t.Fatalf("corrupt gzip body: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// No body at all (no Content-Length, not chunked): Go's client always sends a length on
	// POST, so this one is written by hand.
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /xrpc/com.atproto.repo.uploadBlob HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", c.Auth.AccessJwt)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if want := `{"error":"InvalidRequest","message":"A request body is expected but none was provided"}`; resp.StatusCode != 400 || strings.TrimSpace(string(b)) != want {
		t.Fatalf("no body: %d %s", resp.StatusCode, b)
	}
	// Refused uploads leave nothing behind.
	tmp, err := os.ReadDir(filepath.Join(e.dir, "blobs", "tmp"))
	if err != nil || len(tmp) != 0 {
		t.Fatalf("temp dir after uploads: %v %v", tmp, err)
	}
}

func TestBlobSweepUnreferenced(t *testing.T) {
	ctx := context.Background()
	e := startBlobPDS(t, 0)
	c, _ := e.account(t, "sweep.test")
	sweep := func(want int) {
		t.Helper()
		n, err := e.srv.SweepBlobs(ctx)
		if err != nil || n != want {
			t.Fatalf("SweepBlobs = %d, %v; want %d", n, err, want)
		}
	}
	held := func(b *lexutil.LexBlob) bool {
		_, err := os.Stat(filepath.Join(e.dir, "blobs", c.Auth.Did, b.Ref.String()))
		return err == nil
	}
	unused := upload(t, c, "text/plain", []byte("never referenced"))
	kept := upload(t, c, "text/plain", []byte("referenced twice"))
	for _, rkey := range []string{"a", "b"} {
		if _, err := createRecord(c, rkey, map[string]any{"b": blobField(kept)}); err != nil {
			t.Fatal(xrpcFailure(err))
		}
	}

	e.clock.Add(59 * time.Minute)
	sweep(0)
	e.clock.Add(2 * time.Minute)
	sweep(1)
	if held(unused) || !held(kept) {
		t.Fatalf("after the grace period: unused held %v, kept held %v", held(unused), held(kept))
	}
	if _, err := createRecord(c, "late", map[string]any{"b": blobField(unused)}); !strings.HasPrefix(xrpcFailure(err), "400 BlobNotFound") {
		t.Fatalf("record naming a swept blob: %s", xrpcFailure(err))
	}

	// One of two records goes: the blob is still referenced and served.
	del := func(rkey string) {
		if _, err := comatproto.RepoDeleteRecord(ctx, c, &comatproto.RepoDeleteRecord_Input{Repo: c.Auth.Did, Collection: "app.socialweb.blobtest", Rkey: rkey}); err != nil {
			t.Fatal(xrpcFailure(err))
		}
	}
	del("a")
	e.clock.Add(2 * time.Hour)
	sweep(0)
	if _, err := comatproto.SyncGetBlob(ctx, c, kept.Ref.String(), c.Auth.Did); err != nil {
		t.Fatalf("getBlob with one record left: %s", xrpcFailure(err))
	}
	// The last one goes: no longer served, but kept through the grace period, in which a
	// new record may still name it.
	del("b")
	if _, err := comatproto.SyncGetBlob(ctx, c, kept.Ref.String(), c.Auth.Did); xrpcFailure(err) != "400 InvalidRequest: Blob not found" {
		t.Fatalf("getBlob of a dereferenced blob: %s", xrpcFailure(err))
	}
	e.clock.Add(30 * time.Minute)
	sweep(0)
	if _, err := createRecord(c, "again", map[string]any{"b": blobField(kept)}); err != nil {
		t.Fatalf("re-referencing within the grace period: %s", xrpcFailure(err))
	}
	// An update that drops the reference starts the grace period again.
	putIn := map[string]any{"repo": c.Auth.Did, "collection": "app.socialweb.blobtest", "rkey": "again", "record": map[string]any{"text": "no blob"}}
	if err := c.Do(ctx, xrpc.Procedure, "application/json", "com.atproto.repo.putRecord", nil, putIn, nil); err != nil {
		t.Fatal(xrpcFailure(err))
	}
	e.clock.Add(59 * time.Minute)
	sweep(0)
	e.clock.Add(2 * time.Minute)
	sweep(1)
	if held(kept) {
		t.Fatal("dereferenced blob still held after the grace period")
	}
	if l, _ := comatproto.SyncListBlobs(ctx, c, "", c.Auth.Did, 0, ""); len(l.Cids) != 0 {
		t.Fatalf("listBlobs after every reference went: %v", l.Cids)
	}
}

// BenchmarkUploadGetBlob uploads a 64 KiB blob and reads a referenced one back per iteration,
// over HTTP on loopback.
func BenchmarkUploadGetBlob(b *testing.B) {
	ctx := context.Background()
	e := startBlobPDS(b, 0)
	c, _ := e.account(b, "bench.test")
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	ref := upload(b, c, "application/octet-stream", data)
	if _, err := createRecord(c, "bench", map[string]any{"b": blobField(ref)}); err != nil {
		b.Fatal(xrpcFailure(err))
	}
	b.SetBytes(2 * int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		data[0], data[1], data[2], data[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		upload(b, c, "application/octet-stream", data)
		got, err := comatproto.SyncGetBlob(ctx, c, ref.Ref.String(), c.Auth.Did)
		if err != nil || len(got) != len(data) {
			b.Fatalf("getBlob: %v (%d bytes)", err, len(got))
		}
	}
}

// memStore is a BlobStore that is not the disk: the server needs nothing of a store beyond
// the interface (an S3-compatible one takes its place the same way).
type memStore struct {
	mu    sync.Mutex
	temp  map[string][]byte
	blobs map[string][]byte
	n     int
}

func (m *memStore) PutTemp(_ context.Context, r io.Reader) (string, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	key := fmt.Sprint("t", m.n)
	m.temp[key] = b
	return key, nil
}

func (m *memStore) MakePermanent(_ context.Context, key, did string, c cid.Cid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.temp[key]
	if !ok {
		return pds.ErrBlobNotFound
	}
	delete(m.temp, key)
	m.blobs[did+"/"+c.String()] = b
	return nil
}

func (m *memStore) DeleteTemp(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.temp, key)
	return nil
}

func (m *memStore) Get(_ context.Context, did string, c cid.Cid) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blobs[did+"/"+c.String()]
	if !ok {
		return nil, pds.ErrBlobNotFound
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m *memStore) Has(_ context.Context, did string, c cid.Cid) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.blobs[did+"/"+c.String()]
	return ok, nil
}

func (m *memStore) Delete(_ context.Context, did string, c cid.Cid) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.blobs, did+"/"+c.String())
	return nil
}

func TestBlobStoreReplaceable(t *testing.T) {
	ctx := context.Background()
	store := &memStore{temp: map[string][]byte{}, blobs: map[string][]byte{}}
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := pds.New(pds.Config{DataDir: t.TempDir(), OpenSignup: true, BlobStore: store, BlobSweepInterval: -1,
		Clock: clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	e := &blobEnv{srv: s, clock: clock}
	c, _ := e.account(t, "stowe.test")
	kept := upload(t, c, "text/plain", []byte("kept"))
	upload(t, c, "text/plain", []byte("dropped"))
	if _, err := createRecord(c, "r", map[string]any{"b": blobField(kept)}); err != nil {
		t.Fatal(xrpcFailure(err))
	}
	if got, err := comatproto.SyncGetBlob(ctx, c, kept.Ref.String(), c.Auth.Did); err != nil || string(got) != "kept" {
		t.Fatalf("getBlob: %q %v", got, err)
	}
	clock.Add(2 * time.Hour)
	if n, err := s.SweepBlobs(ctx); n != 1 || err != nil {
		t.Fatalf("sweep = %d, %v", n, err)
	}
	if len(store.blobs) != 1 || len(store.temp) != 0 {
		t.Fatalf("store after sweep: %d blobs, %d temp", len(store.blobs), len(store.temp))
	}
}

func TestDiskBlobStore(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Left by an upload a crash interrupted.
	if err := os.WriteFile(filepath.Join(dir, "tmp", "STALE"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := pds.NewDiskBlobStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tmp", "STALE")); !os.IsNotExist(err) {
		t.Fatalf("stale temp file kept: %v", err)
	}
	c, _ := cid.Parse("bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq")
	const did = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	for i := 0; i < 2; i++ { // the second time the blob is already held
		key, err := d.PutTemp(ctx, strings.NewReader("hello"))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.MakePermanent(ctx, key, did, c); err != nil {
			t.Fatal(err)
		}
	}
	if tmp, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(tmp) != 0 {
		t.Fatalf("temp files left: %v", tmp)
	}
	rc, err := d.Get(ctx, did, c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Fatalf("Get = %q", b)
	}
	for _, bad := range []string{"../etc", "did:plc:a/../../x", "", "did:web:..\\x"} {
		if _, err := d.Get(ctx, bad, c); err == nil || errors.Is(err, pds.ErrBlobNotFound) {
			t.Errorf("Get with owner %q: %v, want a refusal", bad, err)
		}
	}
	if err := d.MakePermanent(ctx, "../x", did, c); err == nil {
		t.Error("MakePermanent with a path as key accepted")
	}
	if err := d.Delete(ctx, did, c); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, did, c); err != nil {
		t.Fatalf("deleting a blob not held: %v", err)
	}
	if has, err := d.Has(ctx, did, c); has || err != nil {
		t.Fatalf("Has after Delete = %v, %v", has, err)
	}
	if _, err := d.Get(ctx, did, c); !errors.Is(err, pds.ErrBlobNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
}
