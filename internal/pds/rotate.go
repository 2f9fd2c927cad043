package pds

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	bolt "go.etcd.io/bbolt"

	"socialweb.computer/internal/pds/plc"
)

// RotateSigningKey gives a hosted account a new #atproto signing key: a PLC operation
// (signed with the server's rotation key) publishes it, then the account and its loaded repo
// switch to it, and an #identity event announces the change. Tokens and commits signed with
// the old key no longer verify against the DID document. It returns the new did:key.
func (s *Server) RotateSigningKey(ctx context.Context, did string) (string, error) {
	acct, err := s.accountOf(did)
	if err != nil {
		return "", err
	}
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		return "", err
	}
	pub, err := key.PublicKey()
	if err != nil {
		return "", err
	}
	last, err := s.plc.Last(ctx, did)
	if err != nil {
		return "", fmt.Errorf("pds: reading PLC log of %s: %w", did, err)
	}
	next := plc.Op{RotationKeys: last.RotationKeys, VerificationMethods: map[string]string{},
		AlsoKnownAs: last.AlsoKnownAs, Services: last.Services}
	for k, v := range last.VerificationMethods {
		next.VerificationMethods[k] = v
	}
	next.VerificationMethods["atproto"] = pub.DIDKey()
	op, err := plc.Next(s.rotationKey, last, next)
	if err != nil {
		return "", err
	}
	rs, err := s.repoFor(did)
	if err != nil {
		return "", err
	}
	// Hold the repo while the key changes, so no commit is signed with a key the DID
	// document no longer names.
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if err := s.plc.Submit(ctx, did, op); err != nil {
		return "", fmt.Errorf("pds: publishing the new key of %s: %w", did, err)
	}
	acct.SigningKey = key.Bytes()
	b, _ := json.Marshal(acct)
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bAccounts).Put([]byte(did), b) }); err != nil {
		return "", err
	}
	rs.key = key
	if err := s.emitIdentity(did, acct.Handle); err != nil {
		return "", err
	}
	return pub.DIDKey(), nil
}
