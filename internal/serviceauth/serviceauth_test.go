package serviceauth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/golang-jwt/jwt/v5"
)

func setup(t *testing.T) (*Verifier, atcrypto.PrivateKey, syntax.DID) {
	t.Helper()
	key, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	did := syntax.DID("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: did, Keys: map[string]identity.VerificationMethod{
		"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}}})
	v := New(Config{Directory: dir, Audiences: []string{"did:web:gw.test", "did:web:other.test"}})
	return v, key, did
}

func TestVerify(t *testing.T) {
	ctx := context.Background()
	v, key, did := setup(t)
	lxm := syntax.NSID("computer.socialweb.k8s.apply")
	tok, _ := auth.SignServiceAuth(did, "did:web:other.test", time.Minute, &lxm, key)
	c, err := v.Verify(ctx, tok, lxm.String())
	if err != nil || c.Issuer != did || c.Audience != "did:web:other.test" {
		t.Fatalf("%v %+v", err, c)
	}
	cases := []struct {
		name, want string
		tok        func() string
		lxm        string
	}{
		{"replay", "JwtReplayed", func() string { return tok }, lxm.String()},
		{"wrong aud", "BadJwtAudience", func() string {
			s, _ := auth.SignServiceAuth(did, "did:web:evil.test", time.Minute, &lxm, key)
			return s
		}, lxm.String()},
		{"wrong lxm", "BadJwtLexiconMethod", func() string {
			s, _ := auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, key)
			return s
		}, "com.atproto.repo.getRecord"},
		{"expired", "JwtExpired", func() string {
			s, _ := auth.SignServiceAuth(did, "did:web:gw.test", -time.Minute, &lxm, key)
			return s
		}, ""},
		{"too long", "BadJwt", func() string {
			s, _ := auth.SignServiceAuth(did, "did:web:gw.test", 3*time.Hour, &lxm, key)
			return s
		}, ""},
		{"other key", "BadJwtSignature", func() string {
			k2, _ := atcrypto.GeneratePrivateKeyK256()
			s, _ := auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, k2)
			return s
		}, ""},
		{"garbage", "BadJwt", func() string { return "a.b" }, ""},
		{"a session token", "BadJwtType", func() string {
			at := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": did.String(), "aud": "did:web:gw.test"})
			at.Header["typ"] = "at+jwt"
			s, _ := at.SignedString([]byte("session secret"))
			return s
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := v.Verify(ctx, tc.tok(), tc.lxm)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want+":") {
				t.Fatalf("want %s, got %v", tc.want, err)
			}
		})
	}
}

func FuzzVerify(f *testing.F) {
	f.Add("eyJhbGciOiJFUzI1NksiLCJ0eXAiOiJKV1QifQ.eyJpc3MiOiJkaWQ6cGxjOngifQ.c2ln")
	f.Add("..")
	f.Add("a.b.c")
	dir := identity.NewMockDirectory()
	v := New(Config{Directory: dir, Audiences: []string{"did:web:gw.test"}})
	f.Fuzz(func(t *testing.T, tok string) {
		_, _ = v.Verify(context.Background(), tok, "")
	})
}

// The issuer's key is parsed once per key, not per call; a rotated key is a new entry, and
// a token of the old key then fails against it.
func TestKeyParsedOncePerKey(t *testing.T) {
	ctx := context.Background()
	v, key, did := setup(t)
	lxm := syntax.NSID("computer.socialweb.k8s.apply")
	for range 20 {
		tok, _ := auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, key)
		if _, err := v.Verify(ctx, tok, lxm.String()); err != nil {
			t.Fatal(err)
		}
	}
	if len(v.keys) != 1 {
		t.Fatalf("%d parsed keys after 20 calls with one key", len(v.keys))
	}
	var first atcrypto.PublicKey
	for _, k := range v.keys {
		first = k
	}
	k2, _ := atcrypto.GeneratePrivateKeyK256()
	pub2, _ := k2.PublicKey()
	dir := v.cfg.Directory.(*identity.MockDirectory)
	dir.Insert(identity.Identity{DID: did, Keys: map[string]identity.VerificationMethod{
		"atproto": {Type: "Multikey", PublicKeyMultibase: pub2.Multibase()}}})
	tok, _ := auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, k2)
	if _, err := v.Verify(ctx, tok, lxm.String()); err != nil {
		t.Fatalf("the rotated key's token: %v", err)
	}
	old, _ := auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, key)
	if _, err := v.Verify(ctx, old, lxm.String()); err == nil || !strings.HasPrefix(err.Error(), "BadJwtSignature:") {
		t.Fatalf("the old key's token after the rotation: %v", err)
	}
	if len(v.keys) != 2 {
		t.Fatalf("%d parsed keys after a rotation", len(v.keys))
	}
	for _, k := range v.keys {
		if k.Multibase() == first.Multibase() {
			return
		}
	}
	t.Errorf("the first key's entry is gone")
}

// Verify of tokens from one issuer whose document is cached: the per-call work.
func BenchmarkVerify(b *testing.B) {
	key, _ := atcrypto.GeneratePrivateKeyK256()
	pub, _ := key.PublicKey()
	did := syntax.DID("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
	dir := identity.NewMockDirectory()
	dir.Insert(identity.Identity{DID: did, Keys: map[string]identity.VerificationMethod{
		"atproto": {Type: "Multikey", PublicKeyMultibase: pub.Multibase()}}})
	v := New(Config{Directory: dir, Audiences: []string{"did:web:gw.test"}})
	lxm := syntax.NSID("computer.socialweb.k8s.apply")
	toks := make([]string, b.N)
	for i := range toks {
		toks[i], _ = auth.SignServiceAuth(did, "did:web:gw.test", time.Minute, &lxm, key)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := v.Verify(context.Background(), toks[i], lxm.String()); err != nil {
			b.Fatal(err)
		}
	}
}
