package pds

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/ipfs/go-cid"
)

// ErrBlobNotFound is what a BlobStore answers for a blob or temp key it does not hold.
var ErrBlobNotFound = errors.New("blob not found")

// BlobStore holds blob bytes; which blobs exist, and who references them, is kept in pds.db.
// An upload streams into temporary storage (PutTemp), its CID is computed on the way, and it
// is then made permanent under the account's DID and that CID. The disk store is the default;
// an S3-compatible store fits the same five calls (temp keys under a prefix, MakePermanent a
// copy and delete).
type BlobStore interface {
	// PutTemp reads r to its end into temporary storage and returns a key naming it.
	PutTemp(ctx context.Context, r io.Reader) (key string, err error)
	// MakePermanent moves the temp upload key to did's blob c; if c is already held, the
	// upload is dropped (same CID, same bytes).
	MakePermanent(ctx context.Context, key, did string, c cid.Cid) error
	// DeleteTemp drops an upload that will not be made permanent.
	DeleteTemp(ctx context.Context, key string) error
	// Get opens did's blob c; ErrBlobNotFound if it is not held.
	Get(ctx context.Context, did string, c cid.Cid) (io.ReadCloser, error)
	// Has says whether did's blob c is held.
	Has(ctx context.Context, did string, c cid.Cid) (bool, error)
	// Delete removes did's blob c; deleting a blob not held is no error.
	Delete(ctx context.Context, did string, c cid.Cid) error
}

// DiskBlobStore keeps blobs as files: <dir>/<did>/<cid>, uploads in progress in <dir>/tmp.
type DiskBlobStore struct{ dir string }

// NewDiskBlobStore opens (creating) a disk store at dir. Temp files left by uploads that a
// crash interrupted are removed: no upload is in progress before the server starts.
func NewDiskBlobStore(dir string) (*DiskBlobStore, error) {
	if err := os.RemoveAll(filepath.Join(dir, "tmp")); err != nil {
		return nil, fmt.Errorf("pds: clearing blob temp dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("pds: blob dir: %w", err)
	}
	return &DiskBlobStore{dir: dir}, nil
}

var tempKeyEnc = base32.StdEncoding.WithPadding(base32.NoPadding)

func (d *DiskBlobStore) tmpPath(key string) (string, error) {
	if key == "" || strings.ContainsAny(key, `/\.`) {
		return "", fmt.Errorf("pds: bad temp blob key %q", key)
	}
	return filepath.Join(d.dir, "tmp", key), nil
}

// blobPath refuses anything but a DID as the directory name, so no request can name a path
// outside the store.
func (d *DiskBlobStore) blobPath(did string, c cid.Cid) (string, error) {
	if _, err := syntax.ParseDID(did); err != nil || strings.ContainsAny(did, `/\`) {
		return "", fmt.Errorf("pds: bad blob owner %q", did)
	}
	return filepath.Join(d.dir, did, c.String()), nil
}

func (d *DiskBlobStore) PutTemp(ctx context.Context, r io.Reader) (string, error) {
	var rnd [20]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", err
	}
	key := tempKeyEnc.EncodeToString(rnd[:])
	p, _ := d.tmpPath(key)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	_, err = io.Copy(f, ctxReader{ctx, r})
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(p)
		return "", err
	}
	return key, nil
}

func (d *DiskBlobStore) MakePermanent(_ context.Context, key, did string, c cid.Cid) error {
	tmp, err := d.tmpPath(key)
	if err != nil {
		return err
	}
	final, err := d.blobPath(did, c)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(final); err == nil {
		return os.Remove(tmp)
	}
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return ErrBlobNotFound
		}
		return err
	}
	// The rename is durable only once the directory is.
	if dir, err := os.Open(filepath.Dir(final)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return nil
}

func (d *DiskBlobStore) DeleteTemp(_ context.Context, key string) error {
	p, err := d.tmpPath(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (d *DiskBlobStore) Get(_ context.Context, did string, c cid.Cid) (io.ReadCloser, error) {
	p, err := d.blobPath(did, c)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrBlobNotFound
	}
	return f, err
}

func (d *DiskBlobStore) Has(_ context.Context, did string, c cid.Cid) (bool, error) {
	p, err := d.blobPath(did, c)
	if err != nil {
		return false, err
	}
	_, err = os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (d *DiskBlobStore) Delete(_ context.Context, did string, c cid.Cid) error {
	p, err := d.blobPath(did, c)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ctxReader stops a copy when its context ends (a client that went away mid-upload).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
