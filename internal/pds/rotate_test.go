package pds_test

import (
	"context"
	"testing"

	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/atclient"
)

// After RotateSigningKey the DID document names the new key, and the next commit is signed
// with it.
func TestRotateSigningKey(t *testing.T) {
	s := startPDS(t, t.TempDir())
	defer s.Close()
	ctx := context.Background()
	did, err := s.CreateAccount(ctx, "rot.test", "rot-password")
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Directory().LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatal(err)
	}
	newKey, err := s.RotateSigningKey(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.Directory().LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatal(err)
	}
	oldPub, _ := before.PublicKey()
	newPub, err := after.PublicKey()
	if err != nil || newPub.DIDKey() != newKey || oldPub.DIDKey() == newKey {
		t.Fatalf("DID key before %s, after %v (%v), rotated to %s", oldPub.DIDKey(), newPub, err, newKey)
	}
	if _, _, err := s.Repo(did).Create(ctx, "com.example.note", "a", map[string]any{"$type": "com.example.note", "text": "x"}); err != nil {
		t.Fatal(err)
	}
	car, err := atclient.New(s.URL()).GetRepo(ctx, did)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.VerifyCommitSignatureFromCar(ctx, s.Directory(), car); err != nil {
		t.Errorf("commit after the rotation: %v", err)
	}
	if _, err := s.RotateSigningKey(ctx, "did:plc:nobodyhere"); err == nil {
		t.Error("rotating an account that is not hosted here succeeded")
	}
}
