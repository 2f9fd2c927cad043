package serviceauth_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/auth"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"socialweb.computer/internal/pds/plc"
	"socialweb.computer/internal/serviceauth"
)

// countingPLC is a did:plc directory served on loopback that counts document fetches.
type countingPLC struct {
	url     string
	fetches atomic.Int64
	rot     *atcrypto.PrivateKeyK256
	client  *plc.Client
}

func startPLC(t *testing.T) *countingPLC {
	t.Helper()
	d, err := plc.Open(filepath.Join(t.TempDir(), "plc.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingPLC{url: "http://" + ln.Addr().String()}
	h := d.Handler()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/did:") && strings.Count(r.URL.Path, "/") == 1 {
			p.fetches.Add(1)
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	p.rot, _ = atcrypto.GeneratePrivateKeyK256()
	p.client = &plc.Client{URL: p.url}
	return p
}

// register makes a DID whose #atproto key is key's.
func (p *countingPLC) register(t *testing.T, handle string, key *atcrypto.PrivateKeyK256) syntax.DID {
	t.Helper()
	rotPub, _ := p.rot.PublicKey()
	pub, _ := key.PublicKey()
	did, op, err := plc.Genesis(p.rot, []string{rotPub.DIDKey()}, pub.DIDKey(), handle, "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.client.Submit(context.Background(), did, op); err != nil {
		t.Fatal(err)
	}
	return syntax.DID(did)
}

// rotate publishes key as did's new #atproto key.
func (p *countingPLC) rotate(t *testing.T, did syntax.DID, key *atcrypto.PrivateKeyK256) {
	t.Helper()
	ctx := context.Background()
	last, err := p.client.Last(ctx, did.String())
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := key.PublicKey()
	next := plc.Op{RotationKeys: last.RotationKeys, VerificationMethods: map[string]string{"atproto": pub.DIDKey()},
		AlsoKnownAs: last.AlsoKnownAs, Services: last.Services}
	op, err := plc.Next(p.rot, last, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.client.Submit(ctx, did.String(), op); err != nil {
		t.Fatal(err)
	}
}

// clock is a settable time for the verifier.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }
func newKey(t *testing.T) *atcrypto.PrivateKeyK256 {
	k, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

const aud = "did:web:gw.test"

var lxm = syntax.NSID("computer.socialweb.cluster.createCluster")

func token(t *testing.T, iss syntax.DID, key atcrypto.PrivateKey) string {
	t.Helper()
	tok, err := auth.SignServiceAuth(iss, aud, time.Minute, &lxm, key)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func wantRefusal(t *testing.T, err error, name string) {
	t.Helper()
	if err == nil || !strings.HasPrefix(err.Error(), name+":") {
		t.Fatalf("want %s, got %v", name, err)
	}
}

// 100 tokens forged for a real DID (signed by a key that is not its #atproto key) cost the
// PLC directory one fresh fetch between them, not one each; the DID's own key, rotated in
// the meantime, is accepted once the refetch interval has passed.
func TestForgedTokensBoundDIDFetches(t *testing.T) {
	ctx := context.Background()
	p := startPLC(t)
	key := newKey(t)
	did := p.register(t, "victim.test", key)
	clk := &clock{now: time.Now()}
	v := serviceauth.New(serviceauth.Config{Directory: serviceauth.CachingDirectory(&identity.BaseDirectory{PLCURL: p.url, SkipHandleVerification: true}),
		Audiences: []string{aud}, Now: clk.Now})

	if _, err := v.Verify(ctx, token(t, did, key), lxm.String()); err != nil {
		t.Fatal(err)
	}
	if n := p.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for the first token, want 1", n)
	}
	forger := newKey(t)
	for i := range 100 {
		_, err := v.Verify(ctx, token(t, did, forger), lxm.String())
		wantRefusal(t, err, "BadJwtSignature")
		_ = i
	}
	if n := p.fetches.Load(); n > 2 {
		t.Fatalf("100 forged tokens made %d DID-document fetches, want at most 2 (the first look-up and one refetch)", n)
	}

	// The owner rotates the key. Its first token comes within the interval the forgeries
	// spent: refused, with no fetch; after the interval the new key is looked up and accepted.
	rotated := newKey(t)
	p.rotate(t, did, rotated)
	before := p.fetches.Load()
	_, err := v.Verify(ctx, token(t, did, rotated), lxm.String())
	wantRefusal(t, err, "BadJwtSignature")
	if p.fetches.Load() != before {
		t.Fatal("a refetch within the interval")
	}
	clk.Add(serviceauth.DefaultRefetchInterval + time.Second)
	if _, err := v.Verify(ctx, token(t, did, rotated), lxm.String()); err != nil {
		t.Fatalf("the rotated key after the interval: %v", err)
	}
	if n := p.fetches.Load(); n != before+1 {
		t.Fatalf("%d fetches for the rotated key's token, want 1", n-before)
	}
}

// Forgeries spread over many DIDs, each refetched for the first time, run into the global
// bound: with the clock standing still, no more refetches than the burst.
func TestForgedTokensAcrossDIDsBoundedGlobally(t *testing.T) {
	ctx := context.Background()
	p := startPLC(t)
	clk := &clock{now: time.Now()}
	v := serviceauth.New(serviceauth.Config{Directory: serviceauth.CachingDirectory(&identity.BaseDirectory{PLCURL: p.url, SkipHandleVerification: true}),
		Audiences: []string{aud}, Now: clk.Now, RefetchBurst: 5, RefetchRate: 1})
	forger := newKey(t)
	const dids = 30
	for i := range dids {
		key := newKey(t)
		did := p.register(t, fmt.Sprintf("d%d.test", i), key)
		if _, err := v.Verify(ctx, token(t, did, key), lxm.String()); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			_, err := v.Verify(ctx, token(t, did, forger), lxm.String())
			wantRefusal(t, err, "BadJwtSignature")
		}
	}
	if refetches := p.fetches.Load() - dids; refetches != 5 {
		t.Fatalf("%d refetches for forgeries over %d DIDs, want the burst of 5", refetches, dids)
	}
}
