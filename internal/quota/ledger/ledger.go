// Package ledger keeps the node time of an account's nodes that are gone, so node-hours
// are counted after their NodeClaims are deleted. The core serves no ConfigMap, so a
// ledger is a core/v1 Secret (type SecretType) per account and namespace, named
// node-time-<16 hex of sha256(DID)>: one entry per ended claim, its UID to its interval.
// Entries older than the quota window are dropped on each write.
package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"socialweb.computer/internal/quota"
)

// SecretType is the type of a node-time ledger.
const SecretType corev1.SecretType = "socialweb.computer/node-time"

// LabelAccount carries the account stamp of a ledger, for listing an account's ledgers.
const LabelAccount = "quota.socialweb.computer/account"

// Stamp is the first 16 hex digits of sha256(DID).
func Stamp(did string) string {
	h := sha256.Sum256([]byte(did))
	return hex.EncodeToString(h[:])[:16]
}

// Name is the ledger's name for an account.
func Name(did string) string { return "node-time-" + Stamp(did) }

// Read returns the entries of every ledger of the account, in every namespace: claim UID
// to interval.
func Read(ctx context.Context, r client.Reader, did string) (map[string]quota.Interval, error) {
	var list corev1.SecretList
	if err := r.List(ctx, &list, client.MatchingLabels{LabelAccount: Stamp(did)}); err != nil {
		return nil, fmt.Errorf("reading the node-time ledgers of %s: %w", did, err)
	}
	out := map[string]quota.Interval{}
	for _, s := range list.Items {
		if s.Type != SecretType {
			continue
		}
		for k, v := range s.Data {
			if iv, err := quota.ParseInterval(string(v)); err == nil {
				out[k] = iv
			}
		}
	}
	return out, nil
}

// Record writes the interval of an ended claim (key its UID) into the account's ledger in
// namespace ns: setting the entry again is harmless, so a retried finalizer counts once.
func Record(ctx context.Context, c client.Client, r client.Reader, ns, did, key string, iv quota.Interval, now time.Time) error {
	for try := 0; ; try++ {
		var s corev1.Secret
		err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: Name(did)}, &s)
		switch {
		case apierrors.IsNotFound(err):
			s = corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: Name(did), Labels: map[string]string{LabelAccount: Stamp(did)},
					Annotations: map[string]string{"quota.socialweb.computer/did": did}},
				Type: SecretType,
				Data: map[string][]byte{key: []byte(quota.FormatInterval(iv))},
			}
			err = c.Create(ctx, &s)
			if apierrors.IsAlreadyExists(err) && try < 5 {
				continue
			}
			return err
		case err != nil:
			return err
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[key] = []byte(quota.FormatInterval(iv))
		for k, v := range s.Data {
			if old, err := quota.ParseInterval(string(v)); err != nil || len(quota.Prune([]quota.Interval{old}, now)) == 0 {
				delete(s.Data, k)
			}
		}
		err = c.Update(ctx, &s)
		if apierrors.IsConflict(err) && try < 5 {
			continue
		}
		return err
	}
}
