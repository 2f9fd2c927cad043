package plc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	bolt "go.etcd.io/bbolt"
)

var (
	bucketLog = []byte("plc_log")
	// bucketExport orders every accepted operation of every DID by createdAt, for /export:
	// key the createdAt in unix milliseconds (8 bytes, big-endian; unique, see stamp), value
	// the DID and the operation's key in the DID's log.
	bucketExport = []byte("plc_export")
)

// Entry is one accepted operation with the time the directory took it.
type Entry struct {
	DID       string    `json:"did"`
	Operation *Op       `json:"operation"`
	CID       string    `json:"cid"`
	Nullified bool      `json:"nullified"`
	CreatedAt time.Time `json:"createdAt"`
}

// TimeFormat is how plc.directory writes createdAt (JavaScript's toISOString).
const TimeFormat = "2006-01-02T15:04:05.000Z"

// MarshalJSON writes createdAt as plc.directory does, in UTC with milliseconds.
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry
	return json.Marshal(struct {
		plain
		CreatedAt string `json:"createdAt"`
	}{plain(e), e.CreatedAt.UTC().Format(TimeFormat)})
}

// Directory holds every DID's operation log in a bbolt file and answers lookups.
// It is safe for concurrent use.
type Directory struct {
	db     *bolt.DB
	ownsDB bool
	mu     sync.Mutex // serialises Submit so that verification and append are atomic per DID
}

// Open opens (or creates) the directory's database at path.
func Open(path string) (*Directory, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("plc: open %s: %w", path, err)
	}
	d, err := NewWithDB(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	d.ownsDB = true
	return d, nil
}

// NewWithDB keeps the directory in a bucket of an already open database.
func NewWithDB(db *bolt.DB) (*Directory, error) {
	err := db.Update(func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketLog); err != nil {
			return err
		}
		if tx.Bucket(bucketExport) != nil {
			return nil
		}
		return buildExportIndex(tx)
	})
	if err != nil {
		return nil, err
	}
	return &Directory{db: db}, nil
}

// Close closes the database if the directory opened it.
func (d *Directory) Close() error {
	if d.ownsDB {
		return d.db.Close()
	}
	return nil
}

// Submit verifies op against the DID's log and appends it.
func (d *Directory) Submit(_ context.Context, did string, op *Op) error {
	if _, err := syntax.ParseDID(did); err != nil || len(did) != len("did:plc:")+24 || did[:8] != "did:plc:" {
		return &Error{Status: 400, Message: "Invalid DID: " + did}
	}
	c, err := op.CID()
	if err != nil {
		return badOp("Invalid operation: %v", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLog)
		entries, err := readLog(b, did)
		if err != nil {
			return err
		}
		ops := make([]*Op, len(entries))
		for i, e := range entries {
			ops[i] = e.Operation
		}
		if err := Verify(did, ops, op); err != nil {
			return err
		}
		sub, err := b.CreateBucketIfNotExists([]byte(did))
		if err != nil {
			return err
		}
		seq, err := sub.NextSequence()
		if err != nil {
			return err
		}
		exp := tx.Bucket(bucketExport)
		at := stamp(exp, time.Now())
		raw, err := json.Marshal(Entry{DID: did, Operation: op, CID: c.String(), CreatedAt: at})
		if err != nil {
			return err
		}
		if err := sub.Put(seqKey(seq), raw); err != nil {
			return err
		}
		return exp.Put(seqKey(uint64(at.UnixMilli())), exportRef(did, seqKey(seq)))
	})
}

// stamp is the createdAt of an operation accepted at now: now in milliseconds (the precision
// plc.directory's timestamps have), or one millisecond after the newest operation when that is
// not earlier. Each operation so has its own createdAt, and /export's after cursor, a
// createdAt, never falls between two operations of one instant.
func stamp(exp *bolt.Bucket, now time.Time) time.Time {
	ms := now.UnixMilli()
	if k, _ := exp.Cursor().Last(); len(k) == 8 {
		if last := int64(binary.BigEndian.Uint64(k)); last >= ms {
			ms = last + 1
		}
	}
	return time.UnixMilli(ms).UTC()
}

func exportRef(did string, key []byte) []byte {
	return append(append([]byte(did), 0), key...)
}

// buildExportIndex indexes the logs of a database written before /export existed, in
// createdAt order (DID and log order break ties), and gives each operation the unique
// millisecond createdAt stamp would have given it.
func buildExportIndex(tx *bolt.Tx) error {
	exp, err := tx.CreateBucket(bucketExport)
	if err != nil {
		return err
	}
	type ref struct {
		did string
		key []byte
		e   Entry
	}
	var all []ref
	logs := tx.Bucket(bucketLog)
	err = logs.ForEach(func(did, v []byte) error {
		sub := logs.Bucket(did)
		if v != nil || sub == nil {
			return nil
		}
		return sub.ForEach(func(k, v []byte) error {
			var e Entry
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			all = append(all, ref{string(did), append([]byte(nil), k...), e})
			return nil
		})
	})
	if err != nil {
		return err
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].e.CreatedAt.Before(all[j].e.CreatedAt) })
	for _, r := range all {
		r.e.CreatedAt = stamp(exp, r.e.CreatedAt)
		raw, err := json.Marshal(r.e)
		if err != nil {
			return err
		}
		if err := logs.Bucket([]byte(r.did)).Put(r.key, raw); err != nil {
			return err
		}
		if err := exp.Put(seqKey(uint64(r.e.CreatedAt.UnixMilli())), exportRef(r.did, r.key)); err != nil {
			return err
		}
	}
	return nil
}

// MaxExportCount is the most operations one /export page holds, as plc.directory.
const MaxExportCount = 1000

// Export returns up to count accepted operations (all DIDs) created after the given time, oldest
// first: plc.directory's /export. The zero time starts at the first operation.
func (d *Directory) Export(_ context.Context, after time.Time, count int) ([]Entry, error) {
	if count < 1 || count > MaxExportCount {
		count = MaxExportCount
	}
	var out []Entry
	err := d.db.View(func(tx *bolt.Tx) error {
		logs := tx.Bucket(bucketLog)
		c := tx.Bucket(bucketExport).Cursor()
		k, v := c.First()
		// after is exclusive: start at the first millisecond past it.
		if ms := after.UnixMilli(); !after.IsZero() && ms >= 0 {
			k, v = c.Seek(seqKey(uint64(ms + 1)))
		}
		for ; k != nil && len(out) < count; k, v = c.Next() {
			did, key, ok := bytes.Cut(v, []byte{0})
			if !ok {
				return fmt.Errorf("plc: bad export index entry %x", k)
			}
			sub := logs.Bucket(did)
			if sub == nil {
				return fmt.Errorf("plc: export index names unknown DID %s", did)
			}
			var e Entry
			if err := json.Unmarshal(sub.Get(key), &e); err != nil {
				return fmt.Errorf("plc: export index entry of %s: %w", did, err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

func seqKey(n uint64) []byte {
	k := make([]byte, 8)
	for i := 7; i >= 0; i-- {
		k[i] = byte(n)
		n >>= 8
	}
	return k
}

func readLog(b *bolt.Bucket, did string) ([]Entry, error) {
	sub := b.Bucket([]byte(did))
	if sub == nil {
		return nil, nil
	}
	var out []Entry
	err := sub.ForEach(func(_, v []byte) error {
		var e Entry
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

// AuditLog returns every accepted operation of did, oldest first.
func (d *Directory) AuditLog(_ context.Context, did string) ([]Entry, error) {
	var out []Entry
	err := d.db.View(func(tx *bolt.Tx) error {
		var err error
		out, err = readLog(tx.Bucket(bucketLog), did)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, did)
	}
	return out, nil
}

// Log returns the operations of did, oldest first.
func (d *Directory) Log(ctx context.Context, did string) ([]*Op, error) {
	entries, err := d.AuditLog(ctx, did)
	if err != nil {
		return nil, err
	}
	ops := make([]*Op, len(entries))
	for i, e := range entries {
		ops[i] = e.Operation
	}
	return ops, nil
}

// Last returns the newest operation of did.
func (d *Directory) Last(ctx context.Context, did string) (*Op, error) {
	ops, err := d.Log(ctx, did)
	if err != nil {
		return nil, err
	}
	return ops[len(ops)-1], nil
}

// ErrTombstoned is returned when the DID's last operation is a tombstone.
var ErrTombstoned = errors.New("DID not available")

// Data is the current state of a DID, as GET /:did/data serves it.
type Data struct {
	DID                 string             `json:"did"`
	VerificationMethods map[string]string  `json:"verificationMethods"`
	RotationKeys        []string           `json:"rotationKeys"`
	AlsoKnownAs         []string           `json:"alsoKnownAs"`
	Services            map[string]Service `json:"services"`
}

// Data returns the current state of did.
func (d *Directory) Data(ctx context.Context, did string) (*Data, error) {
	last, err := d.Last(ctx, did)
	if err != nil {
		return nil, err
	}
	if last.Type == TypeTombstone {
		return nil, fmt.Errorf("%w: %s", ErrTombstoned, did)
	}
	return dataOf(did, last), nil
}

func dataOf(did string, op *Op) *Data {
	out := &Data{DID: did, VerificationMethods: op.VerificationMethods, RotationKeys: op.RotationKeys,
		AlsoKnownAs: op.AlsoKnownAs, Services: op.Services}
	if out.VerificationMethods == nil {
		out.VerificationMethods = map[string]string{}
	}
	if out.Services == nil {
		out.Services = map[string]Service{}
	}
	if out.AlsoKnownAs == nil {
		out.AlsoKnownAs = []string{}
	}
	return out
}

// Document returns the DID document of did.
func (d *Directory) Document(ctx context.Context, did string) (*Document, error) {
	data, err := d.Data(ctx, did)
	if err != nil {
		return nil, err
	}
	return data.Document(), nil
}

// Document is a DID document in the W3C JSON form plc.directory serves.
type Document struct {
	Context []string `json:"@context"`
	identity.DIDDocument
}

// Document renders the DID document of the state.
func (s *Data) Document() *Document {
	doc := &Document{Context: []string{
		"https://www.w3.org/ns/did/v1",
		"https://w3id.org/security/multikey/v1",
		"https://w3id.org/security/suites/secp256k1-2019/v1",
	}}
	doc.DID = syntax.DID(s.DID)
	doc.AlsoKnownAs = s.AlsoKnownAs
	for _, id := range sortedKeys(s.VerificationMethods) {
		key := s.VerificationMethods[id]
		mb := key
		if len(key) > len("did:key:") && key[:8] == "did:key:" {
			mb = key[8:]
		}
		doc.VerificationMethod = append(doc.VerificationMethod, identity.DocVerificationMethod{
			ID: s.DID + "#" + id, Type: "Multikey", Controller: s.DID, PublicKeyMultibase: mb,
		})
	}
	for _, id := range sortedKeys(s.Services) {
		svc := s.Services[id]
		doc.Service = append(doc.Service, identity.DocService{ID: "#" + id, Type: svc.Type, ServiceEndpoint: svc.Endpoint})
	}
	return doc
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}
