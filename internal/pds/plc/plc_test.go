package plc

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

func newKey(t *testing.T) (*atcrypto.PrivateKeyK256, string) {
	t.Helper()
	k, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := k.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return k, pub.DIDKey()
}

func TestPLCGenesisUpdateAndResolve(t *testing.T) {
	ctx := context.Background()
	dir, err := Open(filepath.Join(t.TempDir(), "plc.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	srv := httptest.NewServer(dir.Handler())
	defer srv.Close()
	cl := &Client{URL: srv.URL}

	rot, rotDID := newKey(t)
	_, sigDID := newKey(t)
	did, op, err := Genesis(rot, []string{rotDID}, sigDID, "alice.test", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Submit(ctx, did, op); err != nil {
		t.Fatalf("genesis: %v", err)
	}
	// Replaying the genesis is refused: the DID exists.
	if err := cl.Submit(ctx, did, op); err == nil {
		t.Fatal("second genesis accepted")
	}
	// indigo's resolver reads our document.
	bd := identity.BaseDirectory{PLCURL: srv.URL, SkipHandleVerification: true}
	ident, err := bd.LookupDID(ctx, syntax.DID(did))
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	pub, err := ident.PublicKey()
	if err != nil || pub.DIDKey() != sigDID {
		t.Fatalf("atproto key: %v %v", pub, err)
	}
	if ident.PDSEndpoint() != "http://127.0.0.1:1" {
		t.Fatalf("pds endpoint %q", ident.PDSEndpoint())
	}

	// An update signed by a key that is not a rotation key is refused.
	other, _ := newKey(t)
	bad, err := Next(other, op, Op{RotationKeys: []string{rotDID}, VerificationMethods: op.VerificationMethods,
		AlsoKnownAs: []string{"at://bob.test"}, Services: op.Services})
	if err != nil {
		t.Fatal(err)
	}
	err = cl.Submit(ctx, did, bad)
	var pe *Error
	if !errors.As(err, &pe) || pe.Status != 400 || !strings.Contains(pe.Message, "signature") {
		t.Fatalf("bad signature: %v", err)
	}
	// A proper update is accepted and changes the document.
	good, err := Next(rot, op, Op{RotationKeys: []string{rotDID}, VerificationMethods: op.VerificationMethods,
		AlsoKnownAs: []string{"at://bob.test"}, Services: op.Services})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Submit(ctx, did, good); err != nil {
		t.Fatalf("update: %v", err)
	}
	// A second op on the old head (a fork) is refused.
	fork, _ := Next(rot, op, Op{RotationKeys: []string{rotDID}, AlsoKnownAs: []string{"at://carol.test"}})
	if err := cl.Submit(ctx, did, fork); err == nil {
		t.Fatal("fork accepted")
	}
	data, err := cl.Data(ctx, did)
	if err != nil || data.AlsoKnownAs[0] != "at://bob.test" {
		t.Fatalf("data: %+v %v", data, err)
	}
	last, err := cl.Last(ctx, did)
	if err != nil || last.Sig != good.Sig {
		t.Fatalf("last: %v", err)
	}
	// Tombstone, then the document is gone (410).
	tomb, _ := Next(rot, good, Op{Type: TypeTombstone})
	if err := cl.Submit(ctx, did, tomb); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if _, err := bd.LookupDID(ctx, syntax.DID(did)); err == nil {
		t.Fatal("tombstoned DID resolved")
	}
	if _, err := cl.Data(ctx, "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown DID: %v", err)
	}
}

func TestPLCGenesisMustMatchDID(t *testing.T) {
	rot, rotDID := newKey(t)
	_, op, err := Genesis(rot, []string{rotDID}, rotDID, "a.test", "http://x")
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", nil, op); err == nil {
		t.Fatal("genesis accepted under a foreign DID")
	}
}

func FuzzParseOp(f *testing.F) {
	f.Add([]byte(`{"type":"plc_operation","rotationKeys":["did:key:zQ3shP"],"verificationMethods":{},"alsoKnownAs":[],"services":{},"prev":null,"sig":"aa"}`))
	f.Add([]byte(`{"type":"plc_tombstone","prev":"bafy","sig":"x"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		op, err := ParseOp(b)
		if err != nil {
			return
		}
		_ = Verify("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", nil, op)
		_ = Verify("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", []*Op{op}, op)
	})
}
