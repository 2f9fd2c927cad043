package pds

import (
	"context"
	"encoding/binary"
	"fmt"

	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"
	bolt "go.etcd.io/bbolt"
)

// Buckets of the PDS database. Keys that belong to a repo start with the DID and a zero byte.
var (
	bMeta     = []byte("meta")     // server secrets and keys
	bAccounts = []byte("accounts") // did -> account JSON
	bHandles  = []byte("handles")  // handle -> did
	bRepos    = []byte("repos")    // did -> repo head JSON
	bBlocks   = []byte("blocks")   // did\0cid -> block bytes
	bRecords  = []byte("records")  // did\0collection/rkey -> cid bytes
	bEvents   = []byte("events")   // seq (8 bytes BE) -> firehose frame
	bSessions = []byte("sessions") // refresh token id -> session JSON
	bInvites  = []byte("invites")  // invite code -> inviteCode JSON
	bTokens   = []byte("tokens")   // did\0purpose -> accountToken JSON
	// Blobs: metadata of uploads, and the references records make to them both ways (the
	// count of a blob's references is the number of its bBlobRefs keys).
	bBlobs       = []byte("blobs")       // did\0cid -> blobMeta JSON
	bBlobRefs    = []byte("blobRefs")    // did\0cid\0collection/rkey -> rev of the record
	bRecordBlobs = []byte("recordBlobs") // did\0collection/rkey\0cid -> empty
)

var allBuckets = [][]byte{bMeta, bAccounts, bHandles, bRepos, bBlocks, bRecords, bEvents, bSessions, bInvites, bTokens, bBlobs, bBlobRefs, bRecordBlobs}

func repoKey(did string, rest []byte) []byte {
	k := make([]byte, 0, len(did)+1+len(rest))
	k = append(k, did...)
	k = append(k, 0)
	return append(k, rest...)
}

func seqKey(seq int64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, uint64(seq))
	return k
}

// boltBlocks reads a repo's blocks inside a bbolt read transaction.
type boltBlocks struct {
	tx  *bolt.Tx
	did string
}

func (b boltBlocks) Get(_ context.Context, c cid.Cid) (blocks.Block, error) {
	v := b.tx.Bucket(bBlocks).Get(repoKey(b.did, c.Bytes()))
	if v == nil {
		return nil, &ipld.ErrNotFound{Cid: c}
	}
	return blocks.NewBlockWithCid(append([]byte(nil), v...), c)
}

// memBlocks collects the blocks a write creates; it satisfies the blockstore interface that
// indigo's MST writes its dirty nodes to (mst.Tree.WriteDiffBlocks; the compiler checks it at
// those calls).
type memBlocks struct {
	order []cid.Cid
	m     map[cid.Cid][]byte
}

func newMemBlocks() *memBlocks { return &memBlocks{m: map[cid.Cid][]byte{}} }

func (m *memBlocks) put(c cid.Cid, data []byte) {
	if _, ok := m.m[c]; !ok {
		m.order = append(m.order, c)
	}
	m.m[c] = data
}
func (m *memBlocks) DeleteBlock(_ context.Context, c cid.Cid) error { delete(m.m, c); return nil }
func (m *memBlocks) Has(_ context.Context, c cid.Cid) (bool, error) {
	_, ok := m.m[c]
	return ok, nil
}
func (m *memBlocks) Get(_ context.Context, c cid.Cid) (blocks.Block, error) {
	v, ok := m.m[c]
	if !ok {
		return nil, &ipld.ErrNotFound{Cid: c}
	}
	return blocks.NewBlockWithCid(v, c)
}
func (m *memBlocks) GetSize(_ context.Context, c cid.Cid) (int, error) {
	v, ok := m.m[c]
	if !ok {
		return 0, &ipld.ErrNotFound{Cid: c}
	}
	return len(v), nil
}
func (m *memBlocks) Put(_ context.Context, b blocks.Block) error {
	m.put(b.Cid(), b.RawData())
	return nil
}
func (m *memBlocks) PutMany(ctx context.Context, bs []blocks.Block) error {
	for _, b := range bs {
		m.put(b.Cid(), b.RawData())
	}
	return nil
}
func (m *memBlocks) AllKeysChan(context.Context) (<-chan cid.Cid, error) {
	return nil, fmt.Errorf("not supported")
}
func (m *memBlocks) HashOnRead(bool) {}
