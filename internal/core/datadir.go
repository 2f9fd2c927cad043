package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"socialweb.computer/internal/atomicfile"
	"socialweb.computer/internal/dirlock"
)

// dataDirFormat is the layout version written to the marker file. A data dir with a newer
// format is refused rather than guessed at.
const dataDirFormat = 1

const markerName = "socialweb.json"

// DataDir is the layout of a core's state directory.
type DataDir struct {
	Root string
	lock *dirlock.Lock
}

// marker identifies a directory as a socialweb data dir, so that `up` never writes into a
// directory that belongs to something else.
type marker struct {
	Format    int       `json:"format"`
	CreatedAt time.Time `json:"createdAt"`
}

// ErrDataDirLocked is returned when another process holds the data dir.
var ErrDataDirLocked = errors.New("data dir is in use")

// DataDirError says why a directory cannot be used as a data dir.
type DataDirError struct {
	Path   string
	Reason string
}

func (e *DataDirError) Error() string { return fmt.Sprintf("data dir %s: %s", e.Path, e.Reason) }

func (d *DataDir) Etcd() string            { return filepath.Join(d.Root, "etcd") }
func (d *DataDir) PKI() string             { return filepath.Join(d.Root, "pki") }
func (d *DataDir) Kubeconfig() string      { return filepath.Join(d.Root, "kubeconfig") }
func (d *DataDir) AdminToken() string      { return filepath.Join(d.Root, "pki", "admin.token") }
func (d *DataDir) EncryptionKey() string   { return filepath.Join(d.Root, "pki", "encryption.yaml") }
func (d *DataDir) Logs() string            { return filepath.Join(d.Root, "logs") }
func (d *DataDir) EtcdSocket() string      { return filepath.Join(d.Root, "etcd.sock") }
func (d *DataDir) Path(p ...string) string { return filepath.Join(append([]string{d.Root}, p...)...) }

// OpenDataDir creates or opens the data dir at root and takes its lock. It refuses a
// directory that is not empty and not marked as ours, a marker it cannot read, and a dir
// another live process holds; in each case nothing in the directory is changed.
func OpenDataDir(root string) (*DataDir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, &DataDirError{Path: root, Reason: err.Error()}
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, &DataDirError{Path: abs, Reason: err.Error()}
	}
	d := &DataDir{Root: abs}
	if err := d.checkMarker(); err != nil {
		return nil, err
	}
	if err := d.takeLock(); err != nil {
		return nil, err
	}
	if err := d.writeMarkerIfAbsent(); err != nil {
		d.Close()
		return nil, err
	}
	for _, dir := range []string{d.PKI(), d.Logs()} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			d.Close()
			return nil, &DataDirError{Path: dir, Reason: err.Error()}
		}
	}
	return d, nil
}

// stagedBeforeFirstStart are the entries an operator may put in a data dir before its first
// `up` (the vm image `socialweb image build` writes to DATA_DIR/images/vm, image tarballs and
// registry config of the local node bidder), besides the lock a refused start leaves: a dir
// holding only these is taken as ours.
var stagedBeforeFirstStart = map[string]bool{"lock": true, "images": true, "node-bidder": true}

func (d *DataDir) checkMarker() error {
	b, err := os.ReadFile(filepath.Join(d.Root, markerName))
	if errors.Is(err, os.ErrNotExist) {
		entries, rerr := os.ReadDir(d.Root)
		if rerr != nil {
			return &DataDirError{Path: d.Root, Reason: rerr.Error()}
		}
		for _, e := range entries {
			if !stagedBeforeFirstStart[e.Name()] {
				return &DataDirError{Path: d.Root, Reason: fmt.Sprintf("not a socialweb data dir (it holds %q but no %s); refusing to use it", e.Name(), markerName)}
			}
		}
		return nil
	}
	if err != nil {
		return &DataDirError{Path: d.Root, Reason: err.Error()}
	}
	var m marker
	if err := json.Unmarshal(b, &m); err != nil || m.Format == 0 {
		return &DataDirError{Path: d.Root, Reason: fmt.Sprintf("%s is corrupt; refusing to use this data dir", markerName)}
	}
	if m.Format > dataDirFormat {
		return &DataDirError{Path: d.Root, Reason: fmt.Sprintf("written by a newer socialweb (format %d, this one reads %d)", m.Format, dataDirFormat)}
	}
	return nil
}

func (d *DataDir) writeMarkerIfAbsent() error {
	p := filepath.Join(d.Root, markerName)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	b, _ := json.Marshal(marker{Format: dataDirFormat, CreatedAt: time.Now().UTC()})
	return atomicfile.Write(p, b, 0o600)
}

// takeLock holds the data dir for the life of the process (internal/dirlock): a crashed `up`
// never leaves a stale lock behind.
func (d *DataDir) takeLock() error {
	l, err := dirlock.Acquire(d.Root)
	var held *dirlock.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%w: %s is held by %s (is another `socialweb up` running on it?)", ErrDataDirLocked, d.Root, held.Holder)
	}
	if err != nil {
		return &DataDirError{Path: d.Root, Reason: err.Error()}
	}
	d.lock = l
	return nil
}

// Close releases the lock.
func (d *DataDir) Close() {
	d.lock.Release()
	d.lock = nil
}
