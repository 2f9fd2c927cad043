package computecontract

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IndexSecretName is the Secret the requester keeps its index in, in the controllers' own
// namespace (the leader election's). The core serves no ConfigMap, so it is a core/v1
// Secret of type IndexSecretType, as the node-time ledgers are; what it holds is public
// (records anyone can read from the firehose).
const IndexSecretName = "socialweb-market-index"

// IndexSecretType is the type of the index Secret.
const IndexSecretType corev1.SecretType = "socialweb.computer/market-index"

// indexKey is the data key of the snapshot, gzipped JSON.
const indexKey = "index.json.gz"

// maxSnapshotBytes keeps the Secret under the API server's 1 MiB object limit with room for
// its metadata.
const maxSnapshotBytes = 900 << 10

// SnapshotTooLargeError is a snapshot that does not fit in the Secret. It is not written: the
// one kept stays, with its older cursors.
type SnapshotTooLargeError struct{ Size int }

func (e *SnapshotTooLargeError) Error() string {
	return fmt.Sprintf("the market index is %d KiB compressed, over the %d KiB a Secret holds", e.Size>>10, maxSnapshotBytes>>10)
}

// SecretStore keeps the snapshot in the Secret Key: read uncached (Reader, once at start),
// written by Client with the resourceVersion last read or written, so that of two processes
// both believing they lead, one is refused rather than both interleaving.
type SecretStore struct {
	Client client.Client
	Reader client.Reader
	Key    types.NamespacedName

	last *corev1.Secret
}

// Load reads the snapshot. A Secret that does not hold one of this version is no snapshot
// (the index starts empty and every source is followed from 0) and is overwritten.
func (s *SecretStore) Load(ctx context.Context) (*IndexSnapshot, error) {
	var sec corev1.Secret
	if err := s.Reader.Get(ctx, s.Key, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading the market index %s: %w", s.Key, err)
	}
	s.last = &sec
	snap, err := decodeSnapshot(sec.Data[indexKey])
	if err != nil {
		return nil, fmt.Errorf("the market index %s: %w", s.Key, err)
	}
	return snap, nil
}

// Save writes the snapshot.
func (s *SecretStore) Save(ctx context.Context, snap *IndexSnapshot) error {
	raw, err := encodeSnapshot(snap)
	if err != nil {
		return err
	}
	if s.last == nil {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: s.Key.Namespace, Name: s.Key.Name},
			Type: IndexSecretType, Data: map[string][]byte{indexKey: raw}}
		if err := s.Client.Create(ctx, sec); err != nil {
			if apierrors.IsAlreadyExists(err) {
				err = s.reread(ctx, err)
			}
			return fmt.Errorf("creating the market index %s: %w", s.Key, err)
		}
		s.last = sec
		return nil
	}
	sec := s.last.DeepCopy()
	sec.Type, sec.Data = IndexSecretType, map[string][]byte{indexKey: raw}
	if err := s.Client.Update(ctx, sec); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			err = s.reread(ctx, err)
		}
		return fmt.Errorf("writing the market index %s: %w", s.Key, err)
	}
	s.last = sec
	return nil
}

// reread takes the Secret as it stands for the next Save after err (a conflict: another
// writer; gone: deleted by hand), and returns err.
func (s *SecretStore) reread(ctx context.Context, err error) error {
	var sec corev1.Secret
	switch gerr := s.Reader.Get(ctx, s.Key, &sec); {
	case gerr == nil:
		s.last = &sec
	case apierrors.IsNotFound(gerr):
		s.last = nil
	}
	return err
}

// SnapshotOf reads the snapshot an index Secret holds (nil: none).
func SnapshotOf(sec *corev1.Secret) (*IndexSnapshot, error) {
	return decodeSnapshot(sec.Data[indexKey])
}

func encodeSnapshot(snap *IndexSnapshot) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if err := json.NewEncoder(zw).Encode(snap); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if buf.Len() > maxSnapshotBytes {
		return nil, &SnapshotTooLargeError{Size: buf.Len()}
	}
	return buf.Bytes(), nil
}

// decodeSnapshot reads what encodeSnapshot wrote; nothing (an empty Secret) is no snapshot.
func decodeSnapshot(raw []byte) (*IndexSnapshot, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(io.LimitReader(zr, 64<<20))
	if err != nil {
		return nil, err
	}
	var snap IndexSnapshot
	if err := json.Unmarshal(body, &snap); err != nil {
		return nil, err
	}
	if snap.Version != snapshotVersion {
		return nil, fmt.Errorf("snapshot version %d, this process reads %d", snap.Version, snapshotVersion)
	}
	return &snap, nil
}
