package pds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/bluesky-social/indigo/atproto/repo/mst"
	"github.com/ipfs/go-cid"
	bolt "go.etcd.io/bbolt"
)

// Record is a stored record as getRecord and listRecords return it.
type Record struct {
	URI   string          `json:"uri"`
	CID   string          `json:"cid"`
	Value json.RawMessage `json:"value"`
}

func (s *Server) head(did string) (*repoHead, error) {
	var h repoHead
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bRepos).Get([]byte(did))
		if raw == nil {
			return errRepoNotFound(did)
		}
		return json.Unmarshal(raw, &h)
	})
	if err != nil {
		return nil, err
	}
	return &h, nil
}

// GetRecord reads one record; a missing record is the XRPC error RecordNotFound.
func (s *Server) GetRecord(_ context.Context, did, collection, rkey string) (*Record, error) {
	path := collection + "/" + rkey
	uri := "at://" + did + "/" + path
	var rec *Record
	err := s.db.View(func(tx *bolt.Tx) error {
		cb := tx.Bucket(bRecords).Get(repoKey(did, []byte(path)))
		if cb == nil {
			return errNamed(400, "RecordNotFound", "Could not locate record: %s", uri)
		}
		_, c, err := cid.CidFromBytes(cb)
		if err != nil {
			return err
		}
		data := tx.Bucket(bBlocks).Get(repoKey(did, cb))
		if data == nil {
			return fmt.Errorf("record block %s of %s missing", c, uri)
		}
		val, err := recordJSON(data)
		if err != nil {
			return err
		}
		rec = &Record{URI: uri, CID: c.String(), Value: val}
		return nil
	})
	return rec, err
}

// ListRecords pages through a collection. As in the reference PDS the default order is by
// record key descending; reverse lists ascending. The cursor is the last record key returned.
func (s *Server) ListRecords(_ context.Context, did, collection string, limit int, cursor string, reverse bool) ([]Record, string, error) {
	prefix := repoKey(did, []byte(collection+"/"))
	out := []Record{}
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bRecords).Cursor()
		blocks := tx.Bucket(bBlocks)
		var k, v []byte
		if reverse {
			k, v = c.Seek(append(append([]byte{}, prefix...), cursor...))
			if cursor != "" && k != nil && bytes.Equal(k, append(append([]byte{}, prefix...), cursor...)) {
				k, v = c.Next()
			}
		} else {
			start := append(append([]byte{}, prefix...), cursor...)
			if cursor == "" {
				start = append(append([]byte{}, prefix...), 0xff)
			}
			k, v = c.Seek(start)
			if k == nil {
				k, v = c.Last()
			}
			for k != nil && bytes.Compare(k, start) >= 0 {
				k, v = c.Prev()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, v = step(c, reverse) {
			_, rc, err := cid.CidFromBytes(v)
			if err != nil {
				return err
			}
			data := blocks.Get(repoKey(did, v))
			if data == nil {
				return fmt.Errorf("record block %s missing", rc)
			}
			val, err := recordJSON(data)
			if err != nil {
				return err
			}
			rkey := string(k[len(prefix):])
			out = append(out, Record{URI: "at://" + did + "/" + collection + "/" + rkey, CID: rc.String(), Value: val})
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > 0 {
		last := out[len(out)-1].URI
		next = last[strings.LastIndexByte(last, '/')+1:]
	}
	return out, next, nil
}

func step(c *bolt.Cursor, forward bool) ([]byte, []byte) {
	if forward {
		return c.Next()
	}
	return c.Prev()
}

// collections lists the distinct collections of a repo.
func (s *Server) collections(did string) ([]string, error) {
	out := []string{}
	prefix := repoKey(did, nil)
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bRecords).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); {
			path := string(k[len(prefix):])
			coll, _, _ := strings.Cut(path, "/")
			out = append(out, coll)
			k, _ = c.Seek(append(repoKey(did, []byte(coll)), '/'+1))
		}
		return nil
	})
	return out, err
}

// repoCAR writes the whole current repo (commit, MST nodes, records) as a CAR.
func (s *Server) repoCAR(did string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bRepos).Get([]byte(did))
		if raw == nil {
			return errRepoNotFound(did)
		}
		var h repoHead
		if err := json.Unmarshal(raw, &h); err != nil {
			return err
		}
		commit, err := cid.Parse(h.Commit)
		if err != nil {
			return err
		}
		data, err := cid.Parse(h.Data)
		if err != nil {
			return err
		}
		bs := boltBlocks{tx: tx, did: did}
		order := []cid.Cid{commit}
		var walk func(c cid.Cid) error
		walk = func(c cid.Cid) error {
			blk, err := bs.Get(context.Background(), c)
			if err != nil {
				return err
			}
			nd, err := mst.NodeDataFromCBOR(bytes.NewReader(blk.RawData()))
			if err != nil {
				return err
			}
			order = append(order, c)
			if nd.Left != nil {
				if err := walk(*nd.Left); err != nil {
					return err
				}
			}
			for _, e := range nd.Entries {
				order = append(order, e.Value)
				if e.Right != nil {
					if err := walk(*e.Right); err != nil {
						return err
					}
				}
			}
			return nil
		}
		if err := walk(data); err != nil {
			return err
		}
		out, err = writeCAR(commit, dedupe(order), func(c cid.Cid) []byte {
			return tx.Bucket(bBlocks).Get(repoKey(did, c.Bytes()))
		})
		return err
	})
	return out, err
}

// recordProofCAR writes the commit, the MST nodes on the path to the record, and the record.
func (s *Server) recordProofCAR(did, path string) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		raw := tx.Bucket(bRepos).Get([]byte(did))
		if raw == nil {
			return errRepoNotFound(did)
		}
		var h repoHead
		if err := json.Unmarshal(raw, &h); err != nil {
			return err
		}
		commit, _ := cid.Parse(h.Commit)
		node, err := cid.Parse(h.Data)
		if err != nil {
			return err
		}
		bs := boltBlocks{tx: tx, did: did}
		order := []cid.Cid{commit}
		key := []byte(path)
		found := false
		for {
			blk, err := bs.Get(context.Background(), node)
			if err != nil {
				return err
			}
			nd, err := mst.NodeDataFromCBOR(bytes.NewReader(blk.RawData()))
			if err != nil {
				return err
			}
			order = append(order, node)
			// Find the entry or the subtree where key would be.
			next := nd.Left
			var prev []byte
			done := false
			for _, e := range nd.Entries {
				full := append(append([]byte{}, prev[:e.PrefixLen]...), e.KeySuffix...)
				prev = full
				cmp := bytes.Compare(key, full)
				if cmp == 0 {
					order = append(order, e.Value)
					found, done = true, true
					break
				}
				if cmp < 0 {
					break
				}
				next = e.Right
			}
			if done || next == nil {
				break
			}
			node = *next
		}
		if !found {
			return errNamed(400, "RecordNotFound", "Could not locate record: at://%s/%s", did, path)
		}
		out, err = writeCAR(commit, order, func(c cid.Cid) []byte {
			return tx.Bucket(bBlocks).Get(repoKey(did, c.Bytes()))
		})
		return err
	})
	return out, err
}

func dedupe(cs []cid.Cid) []cid.Cid {
	seen := map[cid.Cid]bool{}
	out := cs[:0]
	for _, c := range cs {
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}
