package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	comatproto "github.com/bluesky-social/indigo/api/atproto"
	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/bluesky-social/indigo/atproto/syntax"
	lexutil "github.com/bluesky-social/indigo/lex/util"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
	carutil "github.com/ipld/go-car/util"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/firehose"
)

// Action is the kind of one write.
type Action string

const (
	ActionCreate Action = "create"
	ActionUpdate Action = "update"
	ActionDelete Action = "delete"
)

// Swap is a compare-and-swap condition on a record: CID "" means the record must not exist.
type Swap struct{ CID string }

// Write is one record write. Record is in the atproto data model (as atdata parses it); Raw is
// the same as JSON and is used when Record is nil.
type Write struct {
	Action     Action
	Collection string
	RKey       string // empty on create: a TID is chosen
	Record     map[string]any
	Raw        json.RawMessage
	SwapRecord *Swap
	// Validate is the write's validate flag: nil validates records of known types only, true
	// refuses unknown types too, false validates nothing (decideCheck).
	Validate *bool
}

// WriteResult is what one write did.
type WriteResult struct {
	Action           Action
	URI              string
	CID              string // empty for a delete
	ValidationStatus string // "valid" or "unknown"; empty for a delete or with Validate false
}

// CommitInfo names the commit a write made.
type CommitInfo struct {
	CID string `json:"cid"`
	Rev string `json:"rev"`
}

// writeMode picks the reference PDS's rules for the endpoint the writes came from.
type writeMode int

const (
	modeBatch  writeMode = iota // applyWrites and createRecord: every write must change something
	modeSingle                  // putRecord/deleteRecord: an unchanged put or a delete of nothing is a no-op
)

// repoState is the in-memory head of one repo. mu serialises its writers.
type repoState struct {
	mu    sync.Mutex
	did   string
	key   atcrypto.PrivateKey
	tree  *mst.Tree
	head  cid.Cid
	data  cid.Cid
	rev   string
	clock *syntax.TIDClock
	// deleted is set, under mu, by DeleteAccount: a writer that took this state before the
	// deletion and waited on mu must not write the repo back.
	deleted bool
}

type repoHead struct {
	Commit string `json:"commit"`
	Data   string `json:"data"`
	Rev    string `json:"rev"`
}

// repoFor returns the loaded state of did's repo, loading it from disk on first use.
func (s *Server) repoFor(did string) (*repoState, error) {
	s.reposMu.Lock()
	rs, ok := s.repos[did]
	if !ok {
		rs = &repoState{did: did}
		s.repos[did] = rs
	}
	s.reposMu.Unlock()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.tree != nil {
		return rs, nil
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		acct, err := getAccount(tx, did)
		if err != nil {
			return err
		}
		key, err := atcrypto.ParsePrivateBytesK256(acct.SigningKey)
		if err != nil {
			return err
		}
		var h repoHead
		raw := tx.Bucket(bRepos).Get([]byte(did))
		if raw == nil {
			return errRepoNotFound(did)
		}
		if err := json.Unmarshal(raw, &h); err != nil {
			return err
		}
		head, err := cid.Parse(h.Commit)
		if err != nil {
			return err
		}
		data, err := cid.Parse(h.Data)
		if err != nil {
			return err
		}
		tree, err := mst.LoadTreeFromStore(context.Background(), boltBlocks{tx: tx, did: did}, data)
		if err != nil {
			return fmt.Errorf("loading MST of %s: %w", did, err)
		}
		if tree.IsPartial() {
			return fmt.Errorf("MST of %s is missing blocks", did)
		}
		clk := syntax.ClockFromTID(syntax.TID(h.Rev))
		rs.key, rs.tree, rs.head, rs.data, rs.rev, rs.clock = key, tree, head, data, h.Rev, &clk
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rs, nil
}

func errRepoNotFound(did string) *XRPCError {
	return errNamed(400, "RepoNotFound", "Could not find repo for DID: %s", did)
}

// preparedWrite is a validated write with its record encoded.
type preparedWrite struct {
	Write
	collection syntax.NSID
	rkey       syntax.RecordKey
	path       string
	rec        *encodedRecord
	status     string
	blobs      []blobRef
}

func (s *Server) prepareWrite(w Write) (*preparedWrite, error) {
	coll, err := parseCollection(w.Collection)
	if err != nil {
		return nil, err
	}
	p := &preparedWrite{Write: w, collection: coll}
	switch w.Action {
	case ActionCreate, ActionUpdate, ActionDelete:
	default:
		return nil, errInvalidRequest("Invalid write action %q", w.Action)
	}
	if w.RKey == "" && w.Action == ActionCreate {
		p.rkey = syntax.RecordKey(s.tidClock.Next().String())
	} else {
		if p.rkey, err = parseRKey(w.RKey); err != nil {
			return nil, err
		}
	}
	p.path = coll.String() + "/" + p.rkey.String()
	if w.SwapRecord != nil && w.SwapRecord.CID != "" {
		if _, err := cid.Parse(w.SwapRecord.CID); err != nil {
			return nil, errInvalidRequest("Invalid CID string (got %q) at $.swapRecord", w.SwapRecord.CID)
		}
	}
	if w.Action == ActionDelete {
		return p, nil
	}
	if w.Record != nil {
		p.rec, err = encodeRecordValue(coll, w.Record)
	} else {
		p.rec, err = encodeRecordJSON(coll, w.Raw)
	}
	if err != nil {
		return nil, err
	}
	p.status, err = s.validateRecord(w.Validate, coll, p.rkey, p.rec.value)
	if err != nil {
		return nil, err
	}
	if p.blobs, err = extractBlobRefs(p.rec.value); err != nil {
		return nil, err
	}
	return p, nil
}

// applyWrites is the one path by which records change. It returns a nil CommitInfo when the
// writes changed nothing (modeSingle only).
func (s *Server) applyWrites(ctx context.Context, did string, writes []Write, swapCommit string, mode writeMode) (*CommitInfo, []WriteResult, error) {
	if len(writes) == 0 {
		return nil, nil, errInvalidRequest("writes must not be empty")
	}
	if len(writes) > 200 {
		return nil, nil, errInvalidRequest("Too many writes. Max: 200")
	}
	var swapCommitCID cid.Cid
	if swapCommit != "" {
		c, err := cid.Parse(swapCommit)
		if err != nil {
			return nil, nil, errInvalidRequest("Invalid CID string (got %q) at $.swapCommit", swapCommit)
		}
		swapCommitCID = c
	}
	prepared := make([]*preparedWrite, len(writes))
	seen := map[string]bool{}
	for i, w := range writes {
		p, err := s.prepareWrite(w)
		if err != nil {
			return nil, nil, err
		}
		if seen[p.path] {
			return nil, nil, errInvalidRequest("duplicate write to %s", p.path)
		}
		seen[p.path] = true
		prepared[i] = p
	}
	rs, err := s.repoFor(did)
	if err != nil {
		return nil, nil, err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.deleted {
		return nil, nil, errRepoNotFound(did)
	}

	results := make([]WriteResult, len(prepared))
	current := make([]*cid.Cid, len(prepared))
	for i, p := range prepared {
		cur, err := rs.tree.Get([]byte(p.path))
		if err != nil {
			return nil, nil, err
		}
		current[i] = cur
		uri := "at://" + did + "/" + p.path
		results[i] = WriteResult{Action: p.Action, URI: uri}
		if p.rec != nil {
			results[i].CID = p.rec.cid.String()
			results[i].ValidationStatus = p.status
		}
	}
	// The reference PDS answers an unchanged put, and a delete of a missing record, before it
	// looks at any swap condition.
	if mode == modeSingle && len(prepared) == 1 {
		p, cur := prepared[0], current[0]
		if p.Action == ActionUpdate && cur != nil && cur.Equals(p.rec.cid) {
			return nil, results, nil
		}
		if p.Action == ActionDelete && cur == nil {
			return nil, results, nil
		}
	}
	if swapCommit != "" && !swapCommitCID.Equals(rs.head) {
		return nil, nil, errNamed(400, "InvalidSwap", "Commit was at %s", rs.head)
	}
	for i, p := range prepared {
		cur := current[i]
		if p.SwapRecord != nil {
			var ok bool
			if p.SwapRecord.CID == "" {
				ok = cur == nil
			} else {
				ok = cur != nil && cur.String() == p.SwapRecord.CID
			}
			if !ok {
				at := "null"
				if cur != nil {
					at = cur.String()
				}
				return nil, nil, errNamed(400, "InvalidSwap", "Record was at %s", at)
			}
		}
		switch p.Action {
		case ActionCreate:
			if cur != nil {
				return nil, nil, errInvalidRequest("Record already exists: at://%s/%s", did, p.path)
			}
		case ActionUpdate:
			if cur == nil && mode == modeBatch {
				return nil, nil, errInvalidRequest("Could not find record to update: at://%s/%s", did, p.path)
			}
			if cur == nil {
				results[i].Action = ActionCreate
			}
		case ActionDelete:
			if cur == nil {
				return nil, nil, errInvalidRequest("Could not find record to delete: at://%s/%s", did, p.path)
			}
		}
	}

	// Build the new tree on a copy: the live tree changes only after the commit is stored.
	tree := rs.tree.Copy()
	blocks := newMemBlocks()
	ops := make([]*comatproto.SyncSubscribeRepos_RepoOp, 0, len(prepared))
	index := make(map[string]*cid.Cid, len(prepared))
	for i, p := range prepared {
		op := &comatproto.SyncSubscribeRepos_RepoOp{Action: string(results[i].Action), Path: p.path}
		if cur := current[i]; cur != nil {
			l := lexutil.LexLink(*cur)
			op.Prev = &l
		}
		if p.Action == ActionDelete {
			if _, err := tree.Remove([]byte(p.path)); err != nil {
				return nil, nil, err
			}
			index[p.path] = nil
		} else {
			if _, err := tree.Insert([]byte(p.path), p.rec.cid); err != nil {
				return nil, nil, err
			}
			blocks.put(p.rec.cid, p.rec.bytes)
			index[p.path] = &p.rec.cid
			l := lexutil.LexLink(p.rec.cid)
			op.Cid = &l
		}
		ops = append(ops, op)
	}
	root, err := tree.WriteDiffBlocks(ctx, blocks)
	if err != nil {
		return nil, nil, err
	}
	since := rs.rev
	prevData := rs.data
	c, err := s.commitRepoWith(ctx, rs, tree, *root, blocks, index, func(tx *bolt.Tx, nextSeq func() (int64, error), commitCID cid.Cid, rev string, carBytes, _ []byte) ([]storedFrame, error) {
		// In the commit's transaction, so that a blob the sweep removes is either still
		// there for this record or refuses it, never half.
		if err := s.updateBlobRefs(tx, did, rev, prepared); err != nil {
			return nil, err
		}
		seq, err := nextSeq()
		if err != nil {
			return nil, err
		}
		b, err := firehose.Encode(firehose.TypeCommit, commitEvent(seq, did, commitCID, rev, &since, carBytes, ops, &prevData))
		if err != nil {
			return nil, err
		}
		return []storedFrame{{seq: seq, typ: firehose.TypeCommit, data: b}}, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return c, results, nil
}

func nowString() string {
	return time.Now().UTC().Format("2006-01-02T15:04:05.000Z")
}

type cborBody interface{ MarshalCBOR(io.Writer) error }

// commitEvent is the #commit body; since and prevData are nil for a repo's first commit.
func commitEvent(seq int64, did string, commitCID cid.Cid, rev string, since *string, carBytes []byte, ops []*comatproto.SyncSubscribeRepos_RepoOp, prevData *cid.Cid) *comatproto.SyncSubscribeRepos_Commit {
	if ops == nil {
		ops = []*comatproto.SyncSubscribeRepos_RepoOp{}
	}
	ev := &comatproto.SyncSubscribeRepos_Commit{
		Seq: seq, Repo: did, Commit: lexutil.LexLink(commitCID), Rev: rev, Since: since,
		Blocks: carBytes, Ops: ops, Blobs: []lexutil.LexLink{}, Time: nowString(),
	}
	if prevData != nil {
		pd := lexutil.LexLink(*prevData)
		ev.PrevData = &pd
	}
	return ev
}

// commitFunc runs inside the commit's transaction: it may write more rows and returns the
// firehose frames of the commit, with seqs taken from nextSeq.
type commitFunc func(tx *bolt.Tx, nextSeq func() (int64, error), commitCID cid.Cid, rev string, carBytes, commitBlock []byte) ([]storedFrame, error)

// commitRepoWith signs a commit over root, then stores the new blocks, the record index changes
// (path -> new CID, nil for removed), the head and the frames fn returns in one transaction,
// and only then replaces the in-memory tree. rs.mu must be held.
func (s *Server) commitRepoWith(ctx context.Context, rs *repoState, tree mst.Tree, root cid.Cid, blocks *memBlocks, index map[string]*cid.Cid, fn commitFunc) (*CommitInfo, error) {
	rev := rs.clock.Next().String()
	if rev <= rs.rev {
		clk := syntax.ClockFromTID(syntax.TID(rs.rev))
		rs.clock = &clk
		rev = rs.clock.Next().String()
	}
	commit := repo.Commit{DID: rs.did, Version: repo.ATPROTO_REPO_VERSION, Data: root, Rev: rev}
	if err := commit.Sign(rs.key); err != nil {
		return nil, err
	}
	var cbuf bytes.Buffer
	if err := commit.MarshalCBOR(&cbuf); err != nil {
		return nil, err
	}
	commitCID, err := cidBuilder.Sum(cbuf.Bytes())
	if err != nil {
		return nil, err
	}
	carBytes, err := writeCAR(commitCID, append([]cid.Cid{commitCID}, blocks.order...), func(c cid.Cid) []byte {
		if c.Equals(commitCID) {
			return cbuf.Bytes()
		}
		return blocks.m[c]
	})
	if err != nil {
		return nil, err
	}
	head := repoHead{Commit: commitCID.String(), Data: root.String(), Rev: rev}
	err = s.storeTx(func(tx *bolt.Tx, nextSeq func() (int64, error)) ([]storedFrame, error) {
		bb := tx.Bucket(bBlocks)
		if err := bb.Put(repoKey(rs.did, commitCID.Bytes()), cbuf.Bytes()); err != nil {
			return nil, err
		}
		for _, c := range blocks.order {
			if err := bb.Put(repoKey(rs.did, c.Bytes()), blocks.m[c]); err != nil {
				return nil, err
			}
		}
		rb := tx.Bucket(bRecords)
		for path, c := range index {
			k := repoKey(rs.did, []byte(path))
			if c == nil {
				if err := rb.Delete(k); err != nil {
					return nil, err
				}
			} else if err := rb.Put(k, c.Bytes()); err != nil {
				return nil, err
			}
		}
		hb, _ := json.Marshal(head)
		if err := tx.Bucket(bRepos).Put([]byte(rs.did), hb); err != nil {
			return nil, err
		}
		return fn(tx, nextSeq, commitCID, rev, carBytes, cbuf.Bytes())
	})
	if err != nil {
		return nil, err
	}
	rs.tree, rs.head, rs.data, rs.rev = &tree, commitCID, root, rev
	return &CommitInfo{CID: commitCID.String(), Rev: rev}, nil
}

// writeCAR writes a CARv1 with one root and the given blocks in order.
func writeCAR(root cid.Cid, order []cid.Cid, get func(cid.Cid) []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := car.WriteHeader(&car.CarHeader{Roots: []cid.Cid{root}, Version: 1}, &buf); err != nil {
		return nil, err
	}
	for _, c := range order {
		data := get(c)
		if data == nil {
			return nil, fmt.Errorf("block %s missing", c)
		}
		if err := carutil.LdWrite(&buf, c.Bytes(), data); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}
