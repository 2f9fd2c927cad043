package pds

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	bolt "go.etcd.io/bbolt"
)

// Blob defaults, as the reference PDS has them where it has one.
const (
	// DefaultBlobUploadLimit is the reference PDS's PDS_BLOB_UPLOAD_LIMIT default.
	DefaultBlobUploadLimit = 5 << 20
	// DefaultBlobGrace is how long a blob no record references is kept: an upload waiting for
	// the record that will name it, or a blob whose last record went.
	DefaultBlobGrace = time.Hour
	// DefaultBlobSweepInterval is how often unreferenced blobs past their grace are removed.
	DefaultBlobSweepInterval = 5 * time.Minute
)

// blobMeta is what pds.db knows of one uploaded blob (bBlobs: did\0cid -> JSON).
type blobMeta struct {
	MimeType  string    `json:"mimeType"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"createdAt"`
	// Unreferenced is when the blob last became referenced by no record (its upload, or the
	// removal of its last reference); zero while a record references it.
	Unreferenced time.Time `json:"unreferenced,omitzero"`
}

func blobKey(did, c string) []byte { return repoKey(did, []byte(c)) }

// blobRefKey is bBlobRefs' key did\0cid\0path; recordBlobKey is bRecordBlobs' did\0path\0cid.
func blobRefKey(did, c, path string) []byte {
	return append(repoKey(did, []byte(c)), append([]byte{0}, path...)...)
}
func recordBlobKey(did, path, c string) []byte {
	return append(repoKey(did, []byte(path)), append([]byte{0}, c...)...)
}

// blobRef is one blob a record names.
type blobRef struct {
	CID      cid.Cid
	MimeType string
	Size     int64
}

// extractBlobRefs finds every blob a record (atdata.UnmarshalJSON output) names, one per CID,
// sorted by CID string. A legacy blob ({cid, mimeType}) is refused, as the reference PDS does.
func extractBlobRefs(record map[string]any) ([]blobRef, error) {
	all := atdata.ExtractBlobs(record)
	seen := map[cid.Cid]bool{}
	out := make([]blobRef, 0, len(all))
	for _, b := range all {
		c := cid.Cid(b.Ref)
		if b.Size < 0 {
			return nil, errInvalidRequest("Legacy blobs are not allowed (%s)", c)
		}
		if seen[c] {
			continue
		}
		seen[c] = true
		out = append(out, blobRef{CID: c, MimeType: b.MimeType, Size: b.Size})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CID.String() < out[j].CID.String() })
	return out, nil
}

// checkBlobRef compares a record's blob reference with the uploaded blob, with the reference
// PDS's error names.
func checkBlobRef(ref blobRef, m *blobMeta) error {
	if m == nil {
		return errNamed(400, "BlobNotFound", "Could not find blob: %s", ref.CID)
	}
	if ref.MimeType != m.MimeType {
		return errNamed(400, "InvalidMimeType", "Referenced Mimetype does not match stored blob. Expected: %s, Got: %s", m.MimeType, ref.MimeType)
	}
	if ref.Size != m.Size {
		return errNamed(400, "InvalidSize", "Referenced Size does not match stored blob. Expected: %d, Got: %d", m.Size, ref.Size)
	}
	return nil
}

func getBlobMeta(tx *bolt.Tx, did, c string) (*blobMeta, error) {
	v := tx.Bucket(bBlobs).Get(blobKey(did, c))
	if v == nil {
		return nil, nil
	}
	var m blobMeta
	if err := json.Unmarshal(v, &m); err != nil {
		return nil, fmt.Errorf("blob %s of %s: %w", c, did, err)
	}
	return &m, nil
}

func putBlobMeta(tx *bolt.Tx, did, c string, m *blobMeta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return tx.Bucket(bBlobs).Put(blobKey(did, c), b)
}

func hasPrefix(b *bolt.Bucket, prefix []byte) bool {
	k, _ := b.Cursor().Seek(prefix)
	return k != nil && bytes.HasPrefix(k, prefix)
}

// blobReferenced says whether any record of did names blob c.
func blobReferenced(tx *bolt.Tx, did, c string) bool {
	return hasPrefix(tx.Bucket(bBlobRefs), append(repoKey(did, []byte(c)), 0))
}

// updateBlobRefs runs in a commit's transaction: it drops the blob references of the records
// the writes replace or delete, checks and adds those of the new records (a blob that was
// never uploaded by did, or whose type or size the record misstates, refuses the whole
// commit), and marks the blobs left with no reference so that the sweep removes them after
// the grace period.
func (s *Server) updateBlobRefs(tx *bolt.Tx, did, rev string, writes []*preparedWrite) error {
	refs, recs := tx.Bucket(bBlobRefs), tx.Bucket(bRecordBlobs)
	touched := map[string]bool{}
	for _, p := range writes {
		if p.Action == ActionCreate {
			continue
		}
		prefix := append(repoKey(did, []byte(p.path)), 0)
		var old [][]byte
		c := recs.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			old = append(old, append([]byte(nil), k...))
		}
		for _, k := range old {
			cs := string(k[len(prefix):])
			if err := recs.Delete(k); err != nil {
				return err
			}
			if err := refs.Delete(blobRefKey(did, cs, p.path)); err != nil {
				return err
			}
			touched[cs] = true
		}
	}
	for _, p := range writes {
		for _, ref := range p.blobs {
			cs := ref.CID.String()
			m, err := getBlobMeta(tx, did, cs)
			if err != nil {
				return err
			}
			if err := checkBlobRef(ref, m); err != nil {
				return err
			}
			if err := refs.Put(blobRefKey(did, cs, p.path), []byte(rev)); err != nil {
				return err
			}
			if err := recs.Put(recordBlobKey(did, p.path, cs), nil); err != nil {
				return err
			}
			touched[cs] = true
		}
	}
	return s.markBlobGrace(tx, did, touched)
}

// UploadedBlob is a stored blob, as uploadBlob answers it.
type UploadedBlob = lexutil.LexBlob

// UploadBlob streams r into the blob store as did's blob: at most Config.BlobUploadLimit
// bytes (more is PayloadTooLarge, and nothing is kept), its type sniffed from its first bytes
// or else declaredType, its CID the raw-codec sha256 of the bytes. The blob stays until the
// sweep removes it, which it does once the grace period passes with no record naming it.
func (s *Server) UploadBlob(ctx context.Context, did string, r io.Reader, declaredType string) (*UploadedBlob, error) {
	if _, err := s.repoFor(did); err != nil {
		return nil, err
	}
	limit := s.cfg.BlobUploadLimit
	br := bufio.NewReaderSize(r, sniffLen)
	head, _ := br.Peek(sniffLen)
	mime := sniffMime(head)
	if mime == "" {
		mime = declaredType
	}
	if mime == "" {
		mime = "application/octet-stream"
	}
	h := sha256.New()
	counted := &countingReader{r: io.LimitReader(br, limit+1)}
	key, err := s.blobs.PutTemp(ctx, io.TeeReader(counted, h))
	if counted.err != nil {
		// The client's side: it went away, or sent a body its Content-Encoding does not read.
		if err == nil {
			_ = s.blobs.DeleteTemp(ctx, key)
		}
		return nil, errInvalidRequest("could not read the upload: %v", counted.err)
	}
	if err != nil {
		return nil, fmt.Errorf("storing upload: %w", err)
	}
	if counted.n > limit {
		_ = s.blobs.DeleteTemp(ctx, key)
		return nil, errPayloadTooLarge()
	}
	mh, err := multihash.Encode(h.Sum(nil), multihash.SHA2_256)
	if err != nil {
		_ = s.blobs.DeleteTemp(ctx, key)
		return nil, err
	}
	c := cid.NewCidV1(cid.Raw, mh)
	now := s.now()
	// blobMu orders this against the sweep: the sweep never deletes bytes that an upload
	// of the same CID has just made permanent again.
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	if err := s.blobs.MakePermanent(ctx, key, did, c); err != nil {
		_ = s.blobs.DeleteTemp(ctx, key)
		return nil, fmt.Errorf("storing upload: %w", err)
	}
	known := false
	err = s.db.Update(func(tx *bolt.Tx) error {
		cs := c.String()
		m, err := getBlobMeta(tx, did, cs)
		if err != nil {
			return err
		}
		if known = m != nil; known {
			// The same bytes again: the type first recorded stays, as in the reference,
			// which keeps the first row of a CID; an unreferenced blob's grace starts over.
			mime = m.MimeType
			if m.Unreferenced.IsZero() {
				return nil
			}
			m.Unreferenced = now
			return putBlobMeta(tx, did, cs, m)
		}
		m = &blobMeta{MimeType: mime, Size: counted.n, CreatedAt: now}
		if !blobReferenced(tx, did, cs) {
			m.Unreferenced = now
		}
		return putBlobMeta(tx, did, cs, m)
	})
	if err != nil {
		if !known {
			// No metadata names the bytes just made permanent, so nothing would ever sweep
			// them; blobMu keeps another upload of the same CID from being between.
			_ = s.blobs.Delete(ctx, did, c)
		}
		return nil, err
	}
	return &UploadedBlob{Ref: lexutil.LexLink(c), MimeType: mime, Size: counted.n}, nil
}

func errPayloadTooLarge() *XRPCError {
	return errNamed(http.StatusRequestEntityTooLarge, "PayloadTooLarge", "request entity too large")
}

// countingReader counts what it reads and keeps the first read error other than EOF.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// decodeContentEncoding undoes a Content-Encoding the way the reference's XRPC server does
// for the encodings Go's standard library reads; others are UnsupportedMediaType.
func decodeContentEncoding(enc string, body io.Reader) (io.Reader, error) {
	r := body
	// Encodings apply in the order listed, so they are undone from the last.
	parts := strings.Split(enc, ",")
	for i := len(parts) - 1; i >= 0; i-- {
		switch strings.ToLower(strings.TrimSpace(parts[i])) {
		case "", "identity":
		case "gzip", "x-gzip":
			gz, err := gzip.NewReader(r)
			if err != nil {
				return nil, errInvalidRequest("invalid gzip body: %v", err)
			}
			r = gz
		case "deflate":
			// HTTP's deflate is the zlib format (RFC 9110), as the reference reads it.
			z, err := zlib.NewReader(r)
			if err != nil {
				return nil, errInvalidRequest("invalid deflate body: %v", err)
			}
			r = z
		default:
			return nil, errNamed(http.StatusUnsupportedMediaType, "UnsupportedMediaType", "unsupported content-encoding")
		}
	}
	return r, nil
}

// BlobInfo is a stored blob's metadata.
type BlobInfo struct {
	MimeType string
	Size     int64
}

// openBlob opens did's blob c for getBlob: only a blob some record references is served, as
// in the reference PDS (whose unreferenced uploads sit in temporary storage).
func (s *Server) openBlob(ctx context.Context, did string, c cid.Cid) (io.ReadCloser, *BlobInfo, error) {
	var m *blobMeta
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		m, err = getBlobMeta(tx, did, c.String())
		if err == nil && m != nil && !blobReferenced(tx, did, c.String()) {
			m = nil
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if m == nil {
		return nil, nil, errInvalidRequest("Blob not found")
	}
	rc, err := s.blobs.Get(ctx, did, c)
	if errors.Is(err, ErrBlobNotFound) {
		return nil, nil, errInvalidRequest("Blob not found")
	}
	if err != nil {
		return nil, nil, err
	}
	return rc, &BlobInfo{MimeType: m.MimeType, Size: m.Size}, nil
}

// scanRefs calls fn for each reference of did's records, in CID order, starting past
// every reference of cursor's CID ("" from the first): the CID, the record's path and the
// rev that wrote it. fn returns false to stop.
func scanRefs(tx *bolt.Tx, did, cursor string, fn func(cid, path string, rev []byte) bool) {
	prefix := repoKey(did, nil)
	c := tx.Bucket(bBlobRefs).Cursor()
	start := prefix
	if cursor != "" {
		start = append(repoKey(did, []byte(cursor)), 1)
	}
	for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		cid, path, ok := strings.Cut(string(k[len(prefix):]), "\x00")
		if ok && !fn(cid, path, v) {
			return
		}
	}
}

// listBlobs pages through the CIDs of the blobs did's records reference, in CID order;
// since (a rev) keeps those referenced by records written after it.
func (s *Server) listBlobs(did, since, cursor string, limit int) ([]string, error) {
	out := []string{}
	err := s.db.View(func(tx *bolt.Tx) error {
		last := ""
		scanRefs(tx, did, cursor, func(cid, _ string, rev []byte) bool {
			if cid == last || (since != "" && string(rev) <= since) {
				return true
			}
			if len(out) == limit {
				return false
			}
			out = append(out, cid)
			last = cid
			return true
		})
		return nil
	})
	return out, err
}

// MissingBlob is a blob a record references that this server does not hold.
type MissingBlob struct {
	CID       string `json:"cid"`
	RecordURI string `json:"recordUri"`
}

// listMissingBlobs pages through the blobs did's records reference with no uploaded blob, in
// CID order, each with one record naming it. Writes refuse such references, so only data
// from elsewhere (an imported repo) has any.
func (s *Server) listMissingBlobs(did, cursor string, limit int) ([]MissingBlob, error) {
	out := []MissingBlob{}
	err := s.db.View(func(tx *bolt.Tx) error {
		last := ""
		scanRefs(tx, did, cursor, func(cid, path string, _ []byte) bool {
			if cid == last {
				return true
			}
			last = cid
			if tx.Bucket(bBlobs).Get(blobKey(did, cid)) != nil {
				return true
			}
			if len(out) == limit {
				return false
			}
			out = append(out, MissingBlob{CID: cid, RecordURI: "at://" + did + "/" + path})
			return true
		})
		return nil
	})
	return out, err
}

// SweepBlobs removes the blobs no record has referenced for the grace period (uploads never
// used, blobs whose records went), metadata first, then bytes. It returns how many it removed.
func (s *Server) SweepBlobs(ctx context.Context) (int, error) {
	cutoff := s.now().Add(-s.cfg.BlobGrace)
	type victim struct{ did, cid string }
	var victims []victim
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bBlobs).ForEach(func(k, v []byte) error {
			var m blobMeta
			if err := json.Unmarshal(v, &m); err != nil {
				return nil
			}
			if !m.Unreferenced.IsZero() && !m.Unreferenced.After(cutoff) {
				did, cs, _ := bytes.Cut(k, []byte{0})
				victims = append(victims, victim{string(did), string(cs)})
			}
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range victims {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		c, err := cid.Parse(v.cid)
		if err != nil {
			continue
		}
		removed, err := s.sweepOne(ctx, v.did, v.cid, c, cutoff)
		if err != nil {
			return n, err
		}
		if removed {
			n++
		}
	}
	return n, nil
}

func (s *Server) sweepOne(ctx context.Context, did, cs string, c cid.Cid, cutoff time.Time) (bool, error) {
	s.blobMu.Lock()
	defer s.blobMu.Unlock()
	removed := false
	// Checked again in the deleting transaction: a record written since the scan keeps it.
	err := s.db.Update(func(tx *bolt.Tx) error {
		m, err := getBlobMeta(tx, did, cs)
		if err != nil || m == nil || m.Unreferenced.IsZero() || m.Unreferenced.After(cutoff) || blobReferenced(tx, did, cs) {
			return err
		}
		removed = true
		return tx.Bucket(bBlobs).Delete(blobKey(did, cs))
	})
	if err != nil || !removed {
		return false, err
	}
	if err := s.blobs.Delete(ctx, did, c); err != nil {
		return true, fmt.Errorf("deleting blob %s of %s: %w", cs, did, err)
	}
	return true, nil
}

// runBlobSweep sweeps every interval until the server closes.
func (s *Server) runBlobSweep(interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.hub.closed:
			return
		case <-t.C:
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-s.hub.closed:
				case <-ctx.Done():
				}
				cancel()
			}()
			n, err := s.SweepBlobs(ctx)
			cancel()
			if err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("blob sweep", "err", err)
			} else if n > 0 {
				s.log.Info("blob sweep", "removed", n)
			}
		}
	}
}
