package pds

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atdata"
	bolt "go.etcd.io/bbolt"
)

const (
	cidA = "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"
	cidB = "bafkreifr76oi5i5hqc5nbgzunrbd2lioi2avsjuhtmmoqqozfa3wvfdgia"
)

func blobJSON(c, mime string, size int) string {
	return `{"$type":"blob","ref":{"$link":"` + c + `"},"mimeType":"` + mime + `","size":` + strconv.Itoa(size) + `}`
}

func TestExtractBlobRefs(t *testing.T) {
	cases := []struct {
		name    string
		record  string
		want    []string // cid mime size, sorted by cid
		wantErr string
	}{
		{"none", `{"text":"hi","n":1}`, nil, ""},
		{"top level", `{"img":` + blobJSON(cidB, "image/png", 69) + `}`, []string{cidB + " image/png 69"}, ""},
		{"nested in arrays and objects, sorted", `{"a":[{"x":` + blobJSON(cidB, "image/png", 69) + `}],"b":{"c":{"d":` + blobJSON(cidA, "text/plain", 5) + `}}}`,
			[]string{cidA + " text/plain 5", cidB + " image/png 69"}, ""},
		{"same blob twice counts once", `{"a":` + blobJSON(cidA, "text/plain", 5) + `,"b":[` + blobJSON(cidA, "text/plain", 5) + `]}`,
			[]string{cidA + " text/plain 5"}, ""},
		{"a $link alone is no blob", `{"l":{"$link":"` + cidA + `"}}`, nil, ""},
		{"legacy blob refused", `{"img":{"cid":"` + cidA + `","mimeType":"text/plain"}}`, nil, "Legacy blobs are not allowed (" + cidA + ")"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			val, err := atdata.UnmarshalJSON([]byte(tc.record))
			if err != nil {
				t.Fatal(err)
			}
			refs, err := extractBlobRefs(val)
			if tc.wantErr != "" {
				var xe *XRPCError
				if !errors.As(err, &xe) || xe.Name != "InvalidRequest" || xe.Message != tc.wantErr {
					t.Fatalf("err %v, want InvalidRequest %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range refs {
				got = append(got, r.CID.String()+" "+r.MimeType+" "+strconv.Itoa(int(r.Size)))
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestCheckBlobRef(t *testing.T) {
	val, _ := atdata.UnmarshalJSON([]byte(`{"i":` + blobJSON(cidA, "text/plain", 5) + `}`))
	refs, _ := extractBlobRefs(val)
	ref := refs[0]
	cases := []struct {
		name     string
		meta     *blobMeta
		wantName string
		wantMsg  string
	}{
		{"never uploaded", nil, "BlobNotFound", "Could not find blob: " + cidA},
		{"type differs", &blobMeta{MimeType: "image/png", Size: 5}, "InvalidMimeType", "Referenced Mimetype does not match stored blob. Expected: image/png, Got: text/plain"},
		{"size differs", &blobMeta{MimeType: "text/plain", Size: 6}, "InvalidSize", "Referenced Size does not match stored blob. Expected: 6, Got: 5"},
		{"matches", &blobMeta{MimeType: "text/plain", Size: 5}, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkBlobRef(ref, tc.meta)
			if tc.wantName == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var xe *XRPCError
			if !errors.As(err, &xe) || xe.Status != 400 || xe.Name != tc.wantName || xe.Message != tc.wantMsg {
				t.Fatalf("err %v, want 400 %s %q", err, tc.wantName, tc.wantMsg)
			}
		})
	}
}

// The expected types are what the reference PDS's sniffer (file-type) answers for the same
// bytes; "" means it does not know them and the declared type is kept.
func TestSniffMime(t *testing.T) {
	png := "\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"
	pad := string(make([]byte, 64))
	cases := []struct {
		name, data, want string
	}{
		{"png", png + "\x00\x00\x00\x0cIDAT" + pad, "image/png"},
		{"apng", png + "\x00\x00\x00\x08acTL\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00" + "\x00\x00\x00\x0cIDAT" + pad, "image/apng"},
		{"jpeg", "\xff\xd8\xff\xe0\x00\x10JFIF\x00" + pad, "image/jpeg"},
		{"gif", "GIF89a\x01\x00\x01\x00" + pad, "image/gif"},
		{"webp", "RIFF\x24\x00\x00\x00WEBPVP8 " + pad, "image/webp"},
		{"wav", "RIFF\x24\x00\x00\x00WAVEfmt " + pad, "audio/wav"},
		{"avi", "RIFF\x24\x00\x00\x00AVI LIST" + pad, "video/vnd.avi"},
		{"mp4", "\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + pad, "video/mp4"},
		{"quicktime", "\x00\x00\x00\x14ftypqt  \x00\x00\x02\x00qt  " + pad, "video/quicktime"},
		{"avif", "\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + pad, "image/avif"},
		{"heic", "\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + pad, "image/heic"},
		{"m4a", "\x00\x00\x00\x18ftypM4A \x00\x00\x02\x00isom" + pad, "audio/x-m4a"},
		{"3gp", "\x00\x00\x00\x18ftyp3gp4\x00\x00\x02\x00isom" + pad, "video/3gpp"},
		{"webm", "\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\xf7\x81\x01\x42\xf2\x81\x04\x42\xf3\x81\x08\x42\x82\x84webm\x42\x87\x81\x04" + pad, "video/webm"},
		{"matroska", "\x1a\x45\xdf\xa3\xa3\x42\x86\x81\x01\x42\xf7\x81\x01\x42\xf2\x81\x04\x42\xf3\x81\x08\x42\x82\x88matroska\x42\x87\x81\x04" + pad, "video/matroska"},
		{"pdf", "%PDF-1.4\n" + pad, "application/pdf"},
		{"gzip", "\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + pad, "application/gzip"},
		{"flac", "fLaC\x00\x00\x00\x22" + pad, "audio/flac"},
		{"tiff", "II*\x00\x08\x00\x00\x00" + pad, "image/tiff"},
		{"bmp", "BM" + pad, "image/bmp"},
		{"ico", "\x00\x00\x01\x00\x01\x00\x10\x10\x00\x00\x01\x00\x20\x00" + pad, "image/x-icon"},
		{"ogg opus", "OggS\x00\x02" + string(make([]byte, 20)) + "\x01\x13OpusHead" + pad, "audio/ogg; codecs=opus"},
		{"ogg vorbis", "OggS\x00\x02" + string(make([]byte, 20)) + "\x01\x1e\x01vorbis" + pad, "audio/ogg"},
		{"id3 tag over nothing known", "ID3\x03\x00\x00\x00\x00\x00\x00" + pad, ""},
		{"id3 tag over flac", "ID3\x03\x00\x00\x00\x00\x00\x02\x00\x00fLaC" + pad, "audio/flac"},
		{"text", "hello world", ""},
		{"html is not sniffed", "<!DOCTYPE html><html></html>", ""},
		{"svg is not sniffed", `<svg xmlns="http://www.w3.org/2000/svg"></svg>`, ""},
		{"empty", "", ""},
		{"truncated png chunk", "\x89PNG\r\n\x1a\n\xff\xff\xff\xff", "image/png"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := sniffMime([]byte(tc.data)); got != tc.want {
				t.Fatalf("sniffMime = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecodeContentEncoding(t *testing.T) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write([]byte("hello"))
	_ = w.Close()
	var zl bytes.Buffer
	zw := zlib.NewWriter(&zl)
	_, _ = zw.Write([]byte("hello"))
	_ = zw.Close()
	cases := []struct {
		name, enc, body, want, wantErr string
	}{
		{"none", "", "hello", "hello", ""},
		{"deflate is zlib", "deflate", zl.String(), "hello", ""},
		{"gzip then identity, case-insensitive", "GZIP, identity", gz.String(), "hello", ""},
		{"identity", "identity", "hello", "hello", ""},
		{"gzip", "gzip", gz.String(), "hello", ""},
		{"bad gzip", "gzip", "hello", "", "InvalidRequest"},
		{"unknown", "zstd", "hello", "", "UnsupportedMediaType"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := decodeContentEncoding(tc.enc, bytes.NewReader([]byte(tc.body)))
			if tc.wantErr != "" {
				var xe *XRPCError
				if !errors.As(err, &xe) || xe.Name != tc.wantErr {
					t.Fatalf("err %v, want %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(r)
			if string(b) != tc.want {
				t.Fatalf("got %q", b)
			}
		})
	}
}

// Writes refuse references to blobs not held, so a missing blob comes only from data stored
// some other way; the listing is tested on such rows directly.
func TestListMissingBlobsPages(t *testing.T) {
	s, err := New(Config{DataDir: t.TempDir(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const did = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	err = s.db.Update(func(tx *bolt.Tx) error {
		refs := tx.Bucket(bBlobRefs)
		for _, k := range [][]byte{
			blobRefKey(did, cidB, "app.x/1"), blobRefKey(did, cidB, "app.x/2"),
			blobRefKey(did, cidA, "app.x/3"),
			blobRefKey("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", cidA, "app.x/9"),
		} {
			if err := refs.Put(k, []byte("3aaaaaaaaaaaa")); err != nil {
				return err
			}
		}
		return putBlobMeta(tx, did, cidA, &blobMeta{MimeType: "text/plain", Size: 5})
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.listMissingBlobs(did, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (MissingBlob{CID: cidB, RecordURI: "at://" + did + "/app.x/1"}) {
		t.Fatalf("missing = %+v", got)
	}
	if got, _ := s.listMissingBlobs(did, cidB, 10); len(got) != 0 {
		t.Fatalf("after cursor: %+v", got)
	}
	cids, err := s.listBlobs(did, "", "", 1)
	if err != nil || len(cids) != 1 || cids[0] != cidA {
		t.Fatalf("listBlobs limit 1 = %v, %v", cids, err)
	}
	cids, _ = s.listBlobs(did, "", cidA, 10)
	if len(cids) != 1 || cids[0] != cidB {
		t.Fatalf("listBlobs after %s = %v", cidA, cids)
	}
	if cids, _ := s.listBlobs(did, "3aaaaaaaaaaaa", "", 10); len(cids) != 0 {
		t.Fatalf("listBlobs since the refs' rev = %v", cids)
	}
}

func TestBlobContentType(t *testing.T) {
	cases := map[string]string{
		"":                           "application/octet-stream",
		"text/plain":                 "text/plain; charset=utf-8",
		"text/html":                  "text/html; charset=utf-8",
		"text/plain; charset=latin1": "text/plain; charset=latin1",
		"application/json":           "application/json; charset=utf-8",
		"application/javascript":     "application/javascript; charset=utf-8",
		"image/png":                  "image/png",
		"audio/ogg; codecs=opus":     "audio/ogg; codecs=opus",
		"application/octet-stream":   "application/octet-stream",
	}
	for in, want := range cases {
		if got := blobContentType(in); got != want {
			t.Errorf("blobContentType(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzSniffMime: any first bytes of an upload give a type or "", never a panic.
func FuzzSniffMime(f *testing.F) {
	f.Add([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"))
	f.Add([]byte("\x89PNG\r\n\x1a\n\x7f\xff\xff\xf0acTL"))
	f.Add([]byte("ID3\x03\x00\x00\x00\x00\x00\x02\x00\x00ID3"))
	f.Add([]byte("\x00\x00\x00\x18ftyp"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = sniffMime(b)
	})
}
