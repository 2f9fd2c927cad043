package interop

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"

	"socialweb.computer/internal/pds"
	"socialweb.computer/internal/pds/refpds"
)

// importScenario exports a repo with sync.getRepo, changes it, and imports the export back
// with importRepo through indigo's client: the records come back, the head is the imported
// commit, and the blob a restored record names, removed meanwhile, is listed as missing.
// beforeImport runs after the record naming the blob is deleted: the reference deletes the
// blob then, this server after a grace period, which the test cuts short.
func importScenario(ctx context.Context, t *testing.T, url string, beforeImport func()) []string {
	t.Helper()
	a := newAccount(ctx, t, url, "lou.test", "lou-pw", "lou@example.test")
	did, c, self, anon, add := a.did, a.c, a.self, a.anon, a.add
	const coll = "app.socialweb.interop"
	for _, rk := range []string{"a", "b"} {
		if _, err := c.PutRecord(ctx, coll, rk, map[string]any{"n": rk}, nil); err != nil {
			t.Fatal(err)
		}
	}
	blob, err := comatproto.RepoUploadBlob(ctx, self, bytes.NewReader([]byte("hello import")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRecord(ctx, coll, "c", map[string]any{"b": blob.Blob}, nil); err != nil {
		t.Fatal(err)
	}
	exported, err := comatproto.SyncGetRepo(ctx, anon, did, "")
	if err != nil {
		t.Fatal(err)
	}
	root, err := comatproto.SyncGetLatestCommit(ctx, anon, did)
	if err != nil {
		t.Fatal(err)
	}
	for _, rk := range []string{"b", "c"} {
		if _, err := c.DeleteRecord(ctx, coll, rk, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.PutRecord(ctx, coll, "d", map[string]any{"n": "d"}, nil); err != nil {
		t.Fatal(err)
	}

	beforeImport()
	add("importRepo (anonymous)", nil, comatproto.RepoImportRepo(ctx, anon, bytes.NewReader(exported)))
	add("importRepo of a CAR with two roots", nil, comatproto.RepoImportRepo(ctx, self, bytes.NewReader(twoRoots(t, exported))))
	add("importRepo", nil, comatproto.RepoImportRepo(ctx, self, bytes.NewReader(exported)))
	recs, _, err := c.ListRecords(ctx, did, coll, 100, "", true)
	a.note("listRecords: " + uris(recs) + " " + observe(err))
	head, err := comatproto.SyncGetLatestCommit(ctx, anon, did)
	if err == nil {
		a.note("getLatestCommit is the imported commit: " + boolWord(head.Cid == root.Cid))
	}
	st, err := comatproto.ServerCheckAccountStatus(ctx, self)
	add("checkAccountStatus", st, err, "indexedRecords", "expectedBlobs")
	missing, err := comatproto.RepoListMissingBlobs(ctx, self, "", 100)
	if err == nil {
		a.note("listMissingBlobs: " + shape(missing, "blobs"))
	}
	return a.out
}

func boolWord(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// twoRoots rewrites a CAR v1 header to name its root twice.
func twoRoots(t *testing.T, car []byte) []byte {
	t.Helper()
	// header: varint length, then DAG-CBOR {roots: [cid], version: 1}; rebuild it.
	n, k := uvarint(car)
	hdr := car[k : k+int(n)]
	i := bytes.Index(hdr, []byte{0x81, 0xd8, 0x2a})
	if i < 0 {
		t.Fatal("no roots array in the CAR header")
	}
	j := bytes.Index(hdr, []byte("version"))
	link := hdr[i+1 : j-1]
	nh := append(append(append(append([]byte{}, hdr[:i]...), 0x82), link...), link...)
	nh = append(nh, hdr[j-1:]...)
	out := appendUvarint(nil, uint64(len(nh)))
	out = append(out, nh...)
	return append(out, car[k+int(n):]...)
}

func uvarint(b []byte) (uint64, int) {
	var x uint64
	var s uint
	for i, c := range b {
		if c < 0x80 {
			return x | uint64(c)<<s, i + 1
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, 0
}

func appendUvarint(b []byte, x uint64) []byte {
	for x >= 0x80 {
		b = append(b, byte(x)|0x80)
		x >>= 7
	}
	return append(b, byte(x))
}

func TestInteropImportRepo(t *testing.T) {
	peer := refpds.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	want := importScenario(ctx, t, peer.PDSURL, func() {})
	ours, err := pds.New(pds.Config{DataDir: t.TempDir(), OpenSignup: true, BlobGrace: time.Nanosecond, BlobSweepInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	got := importScenario(ctx, t, ours.URL(), func() {
		time.Sleep(time.Millisecond)
		if n, err := ours.SweepBlobs(ctx); err != nil || n != 1 {
			t.Fatalf("sweep: %d %v", n, err)
		}
	})
	compareLines(t, want, got)
}
