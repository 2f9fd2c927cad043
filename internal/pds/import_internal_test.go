package pds

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/bluesky-social/indigo/atproto/atcrypto"
	"github.com/bluesky-social/indigo/atproto/repo"
	"github.com/ipfs/go-cid"
	car "github.com/ipld/go-car"
)

// resign rebuilds a repo CAR with its commit signed by key (same DID, data and rev).
func resign(t *testing.T, carBytes []byte, key atcrypto.PrivateKey) []byte {
	t.Helper()
	commit, _, err := repo.LoadRepoFromCAR(context.Background(), bytes.NewReader(carBytes))
	if err != nil {
		t.Fatal(err)
	}
	if err := commit.Sign(key); err != nil {
		t.Fatal(err)
	}
	var cb bytes.Buffer
	if err := commit.MarshalCBOR(&cb); err != nil {
		t.Fatal(err)
	}
	root, err := cidBuilder.Sum(cb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	cr, err := car.NewCarReader(bytes.NewReader(carBytes))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[cid.Cid][]byte{root: cb.Bytes()}
	order := []cid.Cid{root}
	for {
		b, err := cr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !b.Cid().Equals(cr.Header.Roots[0]) {
			blocks[b.Cid()] = b.RawData()
			order = append(order, b.Cid())
		}
	}
	out, err := writeCAR(root, order, func(c cid.Cid) []byte { return blocks[c] })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImportRepoVerifies(t *testing.T) {
	ctx := context.Background()
	s := startTestServer(t, nil)
	p, _ := testAccount(t, s, "pat.test")
	q, _ := testAccount(t, s, "quin.test")
	for _, rk := range []string{"a", "b"} {
		if _, _, err := s.Repo(p).Create(ctx, "app.socialweb.test", rk, map[string]any{"n": rk}); err != nil {
			t.Fatal(err)
		}
	}
	exported, err := s.repoCAR(p)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := s.Repo(p).Head(ctx)
	other, err := atcrypto.GeneratePrivateKeyK256()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, did string
		car       []byte
		want      string
	}{
		{"another account's repo", q, exported, "not"},
		{"signed by a key the DID does not name", p, resign(t, exported, other), "not signed by the DID's signing key"},
		{"not a CAR", p, []byte("hello"), "Could not read CAR"},
		{"truncated", p, exported[:len(exported)/2], "Could not read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.ImportRepo(ctx, tc.did, tc.car)
			xe, ok := err.(*XRPCError)
			if !ok || xe.Name != "InvalidRequest" || !strings.Contains(xe.Message, tc.want) {
				t.Fatalf("ImportRepo: %v", err)
			}
		})
	}
	if h, _ := s.Repo(p).Head(ctx); h.CID != before.CID {
		t.Fatalf("a refused import changed the head: %v", h)
	}

	// An import of an older export takes the repo back; writes after it go on with newer revs.
	if _, err := s.Repo(p).Delete(ctx, "app.socialweb.test", "b", nil); err != nil {
		t.Fatal(err)
	}
	deleted, _ := s.Repo(p).Head(ctx)
	if err := s.ImportRepo(ctx, p, exported); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Repo(p).Head(ctx); h.CID != before.CID {
		t.Fatalf("head after import %v, want %v", h, before)
	}
	if _, err := s.Repo(p).Get(ctx, "app.socialweb.test", "b"); err != nil {
		t.Fatalf("imported record: %v", err)
	}
	c, _, err := s.Repo(p).Create(ctx, "app.socialweb.test", "c", map[string]any{"n": "c"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Rev <= deleted.Rev {
		t.Fatalf("rev after import %s not after %s", c.Rev, deleted.Rev)
	}
	again, err := s.repoCAR(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, r, err := repo.LoadRepoFromCAR(ctx, bytes.NewReader(again)); err != nil || r == nil {
		t.Fatalf("repo after import and write: %v", err)
	}
}
