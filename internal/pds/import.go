package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/xrpc"
)

// DefaultImportLimit is the largest CAR importRepo takes, in bytes (read into memory).
const DefaultImportLimit = 100 << 20

func (s *Server) hImportRepo(ctx context.Context, r *http.Request) (any, error) {
	did, err := s.authAccess(r)
	if err != nil {
		return nil, err
	}
	limit := s.cfg.ImportLimit
	if r.ContentLength > limit {
		return nil, errNamed(http.StatusRequestEntityTooLarge, xrpc.PayloadTooLarge, "request entity too large")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, errInvalidRequest("could not read request body")
	}
	if int64(len(body)) > limit {
		return nil, errNamed(http.StatusRequestEntityTooLarge, xrpc.PayloadTooLarge, "request entity too large")
	}
	return nil, s.ImportRepo(ctx, did, body)
}

// ImportRepo replaces did's repo with the one in carBytes (a CAR of a whole repo, as
// sync.getRepo exports it from another PDS), as the reference's importRepo does, and more
// strictly: the CAR must have one root, a commit for did itself, signed with the key did's
// DID document names now (during a migration, the old PDS's), over an MST whose blocks are
// all there and whose root the commit names. Record blocks may be missing (the reference
// allows it too). The imported commit becomes the head; the record index and the blob
// references are rebuilt from it (blobs not yet uploaded are what listMissingBlobs then
// lists). No firehose event is emitted: as in the reference, the account's activation
// announces the repo.
func (s *Server) ImportRepo(ctx context.Context, did string, carBytes []byte) error {
	cr, err := car.NewCarReader(bytes.NewReader(carBytes))
	if err != nil {
		return errInvalidRequest("Could not read CAR: %v", err)
	}
	if len(cr.Header.Roots) != 1 {
		return errInvalidRequest("expected one root")
	}
	commit, imported, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(carBytes))
	if err != nil {
		return errInvalidRequest("Could not read repo from CAR: %v", err)
	}
	if commit.DID != did {
		return errInvalidRequest("The repo is %s's, not %s's", commit.DID, did)
	}
	if imported.MST.IsPartial() {
		return errInvalidRequest("The CAR is missing MST blocks")
	}
	if root, err := imported.MST.RootCID(); err != nil || !root.Equals(commit.Data) {
		return errInvalidRequest("The MST in the CAR does not hash to the commit's data CID")
	}
	ident, err := s.dir.LookupDID(ctx, syntax.DID(did))
	if err != nil {
		return errInvalidRequest("Could not resolve DID: %v", err)
	}
	pub, err := ident.PublicKey()
	if err != nil {
		return errInvalidRequest("The DID document names no signing key: %v", err)
	}
	if err := commit.VerifySignature(pub); err != nil {
		return errInvalidRequest("The repo's commit is not signed by the DID's signing key: %v", err)
	}
	headCID := cr.Header.Roots[0]

	// Every block of the CAR is kept, as the reference keeps them; the record index and blob
	// references are derived from the tree.
	blocks := map[cid.Cid][]byte{}
	for {
		blk, err := cr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errInvalidRequest("Could not read CAR: %v", err)
		}
		blocks[blk.Cid()] = blk.RawData()
	}
	type leaf struct {
		path string
		c    cid.Cid
		refs []blobRef
	}
	var leaves []leaf
	err = imported.MST.Walk(func(k []byte, v cid.Cid) error {
		l := leaf{path: string(k), c: v}
		if raw, ok := blocks[v]; ok {
			rec, err := atdata.UnmarshalCBOR(raw)
			if err != nil {
				return errInvalidRequest("Could not parse record at '%s'", k)
			}
			for _, b := range atdata.ExtractBlobs(rec) {
				l.refs = append(l.refs, blobRef{CID: cid.Cid(b.Ref), MimeType: b.MimeType, Size: b.Size})
			}
		}
		leaves = append(leaves, l)
		return nil
	})
	if err != nil {
		return err
	}

	rs, err := s.repoFor(did)
	if err != nil {
		return err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.deleted {
		return errRepoNotFound(did)
	}
	prefix := repoKey(did, nil)
	head := repoHead{Commit: headCID.String(), Data: commit.Data.String(), Rev: commit.Rev}
	err = s.storeTx(func(tx *bolt.Tx, _ func() (int64, error)) ([]storedFrame, error) {
		bb := tx.Bucket(bBlocks)
		for c, raw := range blocks {
			if err := bb.Put(repoKey(did, c.Bytes()), raw); err != nil {
				return nil, err
			}
		}
		// The blobs the old records referenced: those no new record names start their grace.
		touched := map[string]bool{}
		c := tx.Bucket(bBlobRefs).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			rest := k[len(prefix):]
			if i := bytes.IndexByte(rest, 0); i >= 0 {
				touched[string(rest[:i])] = true
			}
		}
		for _, b := range [][]byte{bRecords, bBlobRefs, bRecordBlobs} {
			if err := deletePrefix(tx.Bucket(b), prefix); err != nil {
				return nil, err
			}
		}
		rb, refs, recs := tx.Bucket(bRecords), tx.Bucket(bBlobRefs), tx.Bucket(bRecordBlobs)
		for _, l := range leaves {
			if err := rb.Put(repoKey(did, []byte(l.path)), l.c.Bytes()); err != nil {
				return nil, err
			}
			for _, ref := range l.refs {
				cs := ref.CID.String()
				if err := refs.Put(blobRefKey(did, cs, l.path), []byte(commit.Rev)); err != nil {
					return nil, err
				}
				if err := recs.Put(recordBlobKey(did, l.path, cs), nil); err != nil {
					return nil, err
				}
				touched[cs] = true
			}
		}
		if err := s.markBlobGrace(tx, did, touched); err != nil {
			return nil, err
		}
		hb, err := json.Marshal(head)
		if err != nil {
			return nil, err
		}
		return nil, tx.Bucket(bRepos).Put([]byte(did), hb)
	})
	if err != nil {
		return err
	}
	tree := imported.MST
	clk := syntax.ClockFromTID(syntax.TID(commit.Rev))
	if clk.Next().String() <= rs.rev {
		// Revs keep growing across the import, whatever the imported rev.
		clk = syntax.ClockFromTID(syntax.TID(rs.rev))
	}
	rs.tree, rs.head, rs.data, rs.rev, rs.clock = &tree, headCID, commit.Data, commit.Rev, &clk
	s.log.Info("repo imported", "did", did, "commit", headCID.String(), "records", len(leaves))
	return nil
}

// markBlobGrace sets or clears, for each blob in touched that did holds, the time it became
// unreferenced, from whether any record references it now.
func (s *Server) markBlobGrace(tx *bolt.Tx, did string, touched map[string]bool) error {
	now := s.now()
	for cs := range touched {
		m, err := getBlobMeta(tx, did, cs)
		if err != nil {
			return err
		}
		if m == nil {
			continue
		}
		ref := blobReferenced(tx, did, cs)
		switch {
		case ref && !m.Unreferenced.IsZero():
			m.Unreferenced = time.Time{}
		case !ref && m.Unreferenced.IsZero():
			m.Unreferenced = now
		default:
			continue
		}
		if err := putBlobMeta(tx, did, cs, m); err != nil {
			return err
		}
	}
	return nil
}
